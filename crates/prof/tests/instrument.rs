//! Every library kernel, instrumented: it verifies, assembles for sm_90, computes exactly
//! what the plain kernel computes (and passes the kernel's own check) in the
//! interpreter, and records ordered timestamps and the full block count.

use quench_kernels::{compare, library, run_case, CaseArg, KernelCase};
use quench_prof::{instrument, shapes::small_params, InstrumentError, Ring, RING_PARAM};
use quench_rt::{Executor, InterpExecutor, StreamId};

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
        assert_eq!((unused.start_ns, unused.end_ns, unused.blocks_done), (0, 0, 0), "{}", spec.name);
        eprintln!("{:<24} blocks {:>4}  start {:>9}  end {:>9}", spec.name, d.blocks_done, d.start_ns, d.end_ns);
        if d.blocks_done != blocks(&case) {
            failures.push(format!("{}: {} blocks counted, grid has {}", spec.name, d.blocks_done, blocks(&case)));
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
    // Collecting frees the slots, zeroed.
    let extra = ring.next("again", StreamId::DEFAULT).expect("slot");
    assert_eq!(extra[1], quench_rt::Arg::U32(0));
    assert_eq!(ring.collect(&mut exec).expect("records")[0].end_ns, 0);
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
        assert_eq!(d[0].blocks_done, blocks(&case), "run {run}: {:?}", d[0]);
        assert!(previous_end <= d[0].start_ns && d[0].start_ns < d[0].end_ns, "run {run}: {:?}", d[0]);
        previous_end = d[0].end_ns;
    }
    // Read again without a launch: no blocks counted since, times unchanged.
    let again = ring.read(&mut exec).expect("records");
    assert_eq!((again[0].blocks_done, again[0].end_ns), (0, previous_end));
}
