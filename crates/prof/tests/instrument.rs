//! Every library kernel, instrumented: it verifies, assembles for sm_90, computes exactly
//! what the plain kernel computes (and passes the kernel's own check) in the
//! interpreter, and records ordered timestamps, one launch and every end-time lane its
//! blocks reach. A hand-built kernel over random 3-D grids checks the lanes word by
//! word, the launch counter, and records read back after each replay of a graph.

use quench_ir::{AddrSpace, Builder, Function, Scalar, Special, Type};
use quench_kernels::{compare, library, run_case, CaseArg, KernelCase};
use quench_prof::order::check_order;
use quench_prof::{
    instrument, shapes::small_params, InstrumentError, Ring, FIRST_LANE_PLANE, LANES, LAUNCH_PLANE, RING_PARAM,
    START_PLANE,
};
use quench_rt::{Arg, DevicePtr, Executor, InterpExecutor, Launch, StreamId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn seed() -> u64 {
    let s = std::env::var("QUENCH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("seed {s} (set QUENCH_SEED={s} to replay)");
    s
}

fn small_case(name: &str, seed: u64) -> KernelCase {
    let spec = quench_kernels::find(name).unwrap_or_else(|e| panic!("{e}"));
    let p = spec.parse_params(small_params(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    spec.make_case(&p, seed).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn blocks(case: &KernelCase) -> u32 {
    let g = case.launch.grid;
    g[0] * g[1] * g[2]
}

#[test]
fn every_kernel_instrumented_runs_the_same() {
    let seed = seed();
    let mut failures = vec![];
    for spec in library() {
        let case = small_case(spec.name, seed);
        let inst = instrument(&case.kernel).unwrap_or_else(|e| panic!("{}: {e}", spec.name));
        assert_eq!(inst.params.len(), case.kernel.params.len() + 2);

        let mut exec = InterpExecutor::new();
        let plain = run_case(&mut exec, &case).unwrap_or_else(|e| panic!("{e}"));
        let mut ring = Ring::new(&mut exec, 4).expect("ring");
        let mut profiled = case.clone();
        profiled.kernel = inst;
        // Take slot 0 for an unused record so the launch writes a non-zero slot.
        ring.next("unused", StreamId::DEFAULT).expect("slot");
        let extra = ring.next(spec.name, StreamId::DEFAULT).expect("slot");
        profiled.args.extend(extra.map(CaseArg::Scalar));
        let out = run_case(&mut exec, &profiled).unwrap_or_else(|e| panic!("{e}"));
        let records = ring.collect(&mut exec).expect("records");

        if out != plain {
            failures.push(format!("{}: outputs differ from the plain kernel's", spec.name));
        }
        for r in compare(&profiled, &out).expect("comparable") {
            if !r.passed {
                failures.push(format!("{}: instrumented output fails its check: {r}", spec.name));
            }
        }
        let (unused, d) = (&records[0], &records[1]);
        assert_eq!((unused.start_ns, unused.end_ns, unused.launches), (0, 0, 0), "{}", spec.name);
        eprintln!("{:<24} lanes {}  start {:>9}  end {:>9}", spec.name, d.lanes_ended, d.start_ns, d.end_ns);
        let lanes = blocks(&case).min(LANES as u32);
        if (d.launches, d.lanes_ended) != (1, lanes) {
            failures.push(format!(
                "{}: {} launches and {} lanes ended, expected 1 and {lanes}",
                spec.name, d.launches, d.lanes_ended
            ));
        }
        if d.end_ns <= d.start_ns {
            failures.push(format!("{}: end {} not after start {}", spec.name, d.end_ns, d.start_ns));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_kernel_instrumented_assembles() {
    if quench_ptx::ptxas::find_ptxas().is_err() {
        eprintln!("no ptxas (set QUENCH_PTXAS): skipped");
        return;
    }
    for spec in library() {
        let f = spec.build(&spec.default_params()).unwrap_or_else(|e| panic!("{}: {e}", spec.name));
        let inst = instrument(&f).unwrap_or_else(|e| panic!("{}: {e}", spec.name));
        let ptx = quench_ptx::emit(&inst).unwrap_or_else(|e| panic!("{}: {e}", spec.name));
        assert!(ptx.contains("%globaltimer"), "{}", spec.name);
        assert!(ptx.contains(".max.u64") && ptx.contains(".add.u64"), "{}: no end-lane max or launch count", spec.name);
        quench_ptx::ptxas::assemble(&ptx, "sm_90").unwrap_or_else(|e| panic!("{}: {e}", spec.name));
    }
}

#[test]
fn instrumenting_twice_is_refused() {
    let spec = &library()[0];
    let f = spec.build(&spec.default_params()).expect("kernel");
    let once = instrument(&f).expect("instrumented");
    match instrument(&once) {
        Err(InstrumentError::ParamTaken { name, .. }) => assert_eq!(name, RING_PARAM),
        other => panic!("expected ParamTaken, got {other:?}"),
    }
}

#[test]
fn serialized_launches_are_ordered_and_disjoint() {
    let case = small_case("add_f32", seed());
    let mut profiled = case.clone();
    profiled.kernel = instrument(&case.kernel).expect("instrumented");
    let mut exec = InterpExecutor::new();
    let mut ring = Ring::new(&mut exec, 8).expect("ring");
    for _ in 0..5 {
        let mut c = profiled.clone();
        c.args.extend(ring.next("add_f32", StreamId::DEFAULT).expect("slot").map(CaseArg::Scalar));
        run_case(&mut exec, &c).expect("run");
    }
    let d = ring.collect(&mut exec).expect("records");
    assert_eq!(d.len(), 5);
    for w in d.windows(2) {
        assert!(w[0].start_ns < w[0].end_ns && w[0].end_ns <= w[1].start_ns, "{w:?}");
    }
    let order = check_order(&d);
    assert_eq!((order.pairs, order.overlaps.len()), (4, 0));
    // The same records with the fourth moved back before the third's end: one overlap.
    let mut shifted = d.clone();
    shifted[3].start_ns = shifted[2].end_ns - 1;
    let order = check_order(&shifted);
    assert_eq!(order.overlaps.len(), 1);
    assert_eq!((order.overlaps[0].first, order.overlaps[0].second, order.overlaps[0].by_ns), (2, 3, 1));
    // Collecting frees the slots, zeroed.
    ring.next("again", StreamId::DEFAULT).expect("slot");
    let again = ring.collect(&mut exec).expect("records");
    assert_eq!((again[0].kernel.as_str(), again[0].end_ns, again[0].launches), ("again", 0, 0));
    ring.release(&mut exec).expect("free");
    assert!(exec.synchronize().is_ok());
}

#[test]
fn one_slot_serves_every_replay_without_reset() {
    // As in a captured graph: the same launch, the same slot, read after each run.
    let case = small_case("rmsnorm_residual_f32", seed());
    let mut profiled = case.clone();
    profiled.kernel = instrument(&case.kernel).expect("instrumented");
    let mut exec = InterpExecutor::new();
    let mut ring = Ring::new(&mut exec, 2).expect("ring");
    profiled.args.extend(ring.next("rmsnorm", StreamId::DEFAULT).expect("slot").map(CaseArg::Scalar));
    let mut previous_end = 0;
    for run in 0..4 {
        run_case(&mut exec, &profiled).expect("run");
        let d = ring.read(&mut exec).expect("records");
        assert_eq!(d.len(), 1);
        let lanes = blocks(&case).min(LANES as u32);
        assert_eq!((d[0].launches, d[0].lanes_ended), (1, lanes), "run {run}: {:?}", d[0]);
        assert!(previous_end <= d[0].start_ns && d[0].start_ns < d[0].end_ns, "run {run}: {:?}", d[0]);
        previous_end = d[0].end_ns;
    }
    // Read again without a launch: no launch counted since, times unchanged.
    let again = ring.read(&mut exec).expect("records");
    assert_eq!((again[0].launches, again[0].lanes_ended, again[0].end_ns), (0, 0, previous_end));
}

/// `out[b · ntid + tid] = b ^ c` for the linear block index `b`, the body the lanes are
/// checked on.
fn grid_kernel() -> Function {
    let mut k = Builder::new("grid_ids", 64);
    let out = k.param("out", Type::Ptr(AddrSpace::Global, Scalar::U32));
    let c = k.param("c", Type::U32);
    let [x, y, z, nx, ny] =
        [Special::CtaidX, Special::CtaidY, Special::CtaidZ, Special::NctaidX, Special::NctaidY].map(|s| k.special(s));
    let nyz = k.mul(ny, z);
    let yz = k.add(y, nyz);
    let nxyz = k.mul(nx, yz);
    let b = k.add(x, nxyz);
    let (tid, ntid) = (k.tid_x(), k.ntid_x());
    let row = k.mul(b, ntid);
    let i = k.add(row, tid);
    let at = k.ptr_add(out, i);
    let v = k.xor(b, c);
    k.store(at, v);
    k.finish().expect("verifies")
}

const THREADS: u32 = 32;

/// Launches of the instrumented [`grid_kernel`] over `grid`, each with its output
/// poisoned first and checked after.
struct GridRun {
    kernel: quench_rt::KernelId,
    grid: [u32; 3],
    out: DevicePtr,
    c: u32,
}

impl GridRun {
    fn new(exec: &mut InterpExecutor, grid: [u32; 3], c: u32) -> GridRun {
        let kernel = exec.load(&instrument(&grid_kernel()).expect("instrumented")).expect("loads");
        let out = exec.alloc(4 * (grid.iter().product::<u32>() * THREADS) as u64).expect("alloc");
        GridRun { kernel, grid, out, c }
    }

    fn blocks(&self) -> u32 {
        self.grid.iter().product()
    }

    fn launch(&self, exec: &mut InterpExecutor, slot: &[Arg; 2]) {
        let poison = vec![0xA5u8; 4 * (self.blocks() * THREADS) as usize];
        exec.copy_to_device(self.out, &poison).expect("poison");
        let launch = Launch { grid: self.grid, block: [THREADS, 1, 1], dynamic_shared_bytes: 0 };
        let args = [Arg::Ptr(self.out), Arg::U32(self.c), slot[0], slot[1]];
        exec.launch(self.kernel, &launch, &args, StreamId::DEFAULT).expect("launch");
    }

    fn check_output(&self, exec: &mut InterpExecutor) {
        let mut bytes = vec![0u8; 4 * (self.blocks() * THREADS) as usize];
        exec.copy_to_host(self.out, &mut bytes).expect("read");
        for (i, w) in bytes.chunks_exact(4).enumerate() {
            let got = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            assert_eq!(got, (i as u32 / THREADS) ^ self.c, "element {i}");
        }
    }
}

/// Word `plane` of the record whose slot arguments are `slot`, straight from the device.
fn word(exec: &mut InterpExecutor, slot: &[Arg; 2], plane: usize) -> u64 {
    let (Arg::Ptr(record), Arg::U32(stride)) = (slot[0], slot[1]) else { panic!("slot arguments {slot:?}") };
    let mut b = [0u8; 8];
    exec.copy_to_host(record.offset(8 * plane as u64 * stride as u64), &mut b).expect("read");
    u64::from_le_bytes(b)
}

#[test]
fn every_block_raises_the_lane_of_its_linear_index() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    for _ in 0..4 {
        let grid = [rng.gen_range(1..6), rng.gen_range(1..4), rng.gen_range(1..3)];
        let mut exec = InterpExecutor::new();
        let run = GridRun::new(&mut exec, grid, rng.gen());
        let mut ring = Ring::new(&mut exec, rng.gen_range(1..40)).expect("ring");
        let slot = ring.next("grid_ids", StreamId::DEFAULT).expect("slot");
        run.launch(&mut exec, &slot);
        run.check_output(&mut exec);

        // The interpreter runs blocks in linear order, so lane `l` holds the end of the
        // last block `b` with `b % LANES == l`, and the lanes' times rank as those blocks.
        let n = run.blocks() as usize;
        let lanes: Vec<u64> = (0..LANES).map(|l| word(&mut exec, &slot, FIRST_LANE_PLANE + l)).collect();
        let start = word(&mut exec, &slot, START_PLANE);
        let last_block = |l: usize| (l < n).then(|| l + (n - 1 - l) / LANES * LANES);
        let mut by_time: Vec<usize> = (0..LANES.min(n)).collect();
        by_time.sort_by_key(|&l| lanes[l]);
        let mut by_block = by_time.clone();
        by_block.sort_by_key(|&l| last_block(l));
        assert_eq!(by_time, by_block, "grid {grid:?}: lanes {lanes:?}");
        for (l, &t) in lanes.iter().enumerate() {
            match last_block(l) {
                Some(_) => assert!(t > start, "grid {grid:?}: lane {l} at {t}, start {start}"),
                None => assert_eq!(t, 0, "grid {grid:?}: lane {l} has no block"),
            }
        }
        assert_eq!(word(&mut exec, &slot, LAUNCH_PLANE), 1);

        let d = &ring.read(&mut exec).expect("records")[0];
        let end = *lanes.iter().max().expect("lanes");
        assert_eq!((d.start_ns, d.end_ns, d.launches, d.lanes_ended), (start, end, 1, n.min(LANES) as u32), "{grid:?}");

        // Two launches before the next reading: both counted, the second's times.
        run.launch(&mut exec, &slot);
        run.launch(&mut exec, &slot);
        run.check_output(&mut exec);
        assert_eq!(word(&mut exec, &slot, LAUNCH_PLANE), 3);
        let second = &ring.read(&mut exec).expect("records")[0];
        assert_eq!((second.launches, second.lanes_ended), (2, n.min(LANES) as u32));
        assert!(second.start_ns > d.end_ns && second.end_ns > second.start_ns, "{second:?} after {d:?}");
        assert_eq!(second.start_ns, word(&mut exec, &slot, START_PLANE));
    }
}

#[test]
fn replayed_graph_records_each_replay_in_order() {
    // As the decoder does: a captured step of several dispatches, each with its own
    // slot, replayed with the same arguments and read back after every replay.
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let mut exec = InterpExecutor::new();
    let runs: Vec<GridRun> = (0..3)
        .map(|_| {
            let grid = [rng.gen_range(1..12), rng.gen_range(1..3), 1];
            GridRun::new(&mut exec, grid, rng.gen())
        })
        .collect();
    let mut ring = Ring::new(&mut exec, runs.len() as u32).expect("ring");
    let slots: Vec<[Arg; 2]> = runs.iter().map(|_| ring.next("grid_ids", StreamId::DEFAULT).expect("slot")).collect();
    exec.begin_capture(StreamId::DEFAULT).expect("capture");
    for (run, slot) in runs.iter().zip(&slots) {
        let launch = Launch { grid: run.grid, block: [THREADS, 1, 1], dynamic_shared_bytes: 0 };
        let args = [Arg::Ptr(run.out), Arg::U32(run.c), slot[0], slot[1]];
        exec.launch(run.kernel, &launch, &args, StreamId::DEFAULT).expect("captured launch");
    }
    let graph = exec.end_capture(StreamId::DEFAULT).expect("graph");
    let mut previous_end = 0;
    for replay in 0..4u32 {
        for run in &runs {
            exec.copy_to_device(run.out, &vec![0x5Au8; 4 * (run.blocks() * THREADS) as usize]).expect("poison");
        }
        exec.replay(graph, StreamId::DEFAULT).expect("replay");
        exec.synchronize().expect("sync");
        for run in &runs {
            run.check_output(&mut exec);
        }
        let mut records = ring.read(&mut exec).expect("records");
        for (r, run) in records.iter_mut().zip(&runs) {
            assert_eq!((r.launches, r.lanes_ended), (1, run.blocks().min(LANES as u32)), "replay {replay}: {r:?}");
            r.step = Some(replay);
        }
        let order = check_order(&records);
        assert_eq!((order.pairs, order.overlaps.len()), (runs.len() - 1, 0), "replay {replay}: {records:?}");
        assert!(previous_end <= records[0].start_ns, "replay {replay} began before the previous one ended");
        previous_end = records.last().expect("records").end_ns;
    }
}
