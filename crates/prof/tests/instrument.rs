//! Every library kernel, instrumented: it verifies, assembles for sm_90, computes exactly
//! what the plain kernel computes (and passes the kernel's own check) in the
//! interpreter, and records ordered timestamps, one launch and every end-time lane its
//! blocks reach. A hand-built kernel over random 3-D grids of random 3-D blocks checks
//! the lanes word by word, the launch counter (counted once, by one thread of the
//! grid), and records read back after each replay of a graph.

use quench_kernels::{compare, library, run_case, CaseArg, KernelCase};
use quench_prof::order::check_order;
use quench_prof::{
    instrument, InstrumentError, Ring, FIRST_LANE_PLANE, LANES, LAUNCH_PLANE, RING_PARAM,
    START_PLANE,
};
use quench_rt::{Arg, Executor, InterpExecutor, StreamId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;

use common::{seed, word, GridRun};

fn small_case(name: &str, seed: u64) -> KernelCase {
    let spec = quench_kernels::find(name).unwrap_or_else(|e| panic!("{e}"));
    let p = spec
        .parse_params(spec.small_params())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    spec.make_case(&p, seed)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The most end-time lanes the blocks of `case` can raise.
fn most_lanes(case: &KernelCase) -> u32 {
    let g = case.launch.grid;
    (g[0] * g[1] * g[2]).min(LANES as u32)
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
            failures.push(format!(
                "{}: outputs differ from the plain kernel's",
                spec.name
            ));
        }
        for r in compare(&profiled, &out).expect("comparable") {
            if !r.passed {
                failures.push(format!(
                    "{}: instrumented output fails its check: {r}",
                    spec.name
                ));
            }
        }
        let (unused, d) = (&records[0], &records[1]);
        assert_eq!(
            (unused.start_ns, unused.end_ns, unused.launches),
            (0, 0, 0),
            "{}",
            spec.name
        );
        eprintln!(
            "{:<24} lanes {}  start {:>9}  end {:>9}",
            spec.name, d.lanes_ended, d.start_ns, d.end_ns
        );
        let lanes = most_lanes(&case);
        if d.launches != 1 || !(1..=lanes).contains(&d.lanes_ended) {
            failures.push(format!(
                "{}: {} launches and {} lanes ended, expected 1 and 1 to {lanes}",
                spec.name, d.launches, d.lanes_ended
            ));
        }
        if d.end_ns <= d.start_ns {
            failures.push(format!(
                "{}: end {} not after start {}",
                spec.name, d.end_ns, d.start_ns
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_kernel_instrumented_assembles() {
    if quench_testkit::ok(quench_ptx::ptxas::find_ptxas()).is_none() {
        return;
    }
    for spec in library() {
        let f = spec
            .build(&spec.default_params())
            .unwrap_or_else(|e| panic!("{}: {e}", spec.name));
        let inst = instrument(&f).unwrap_or_else(|e| panic!("{}: {e}", spec.name));
        let ptx = quench_ptx::emit(&inst).unwrap_or_else(|e| panic!("{}: {e}", spec.name));
        assert!(ptx.contains("%globaltimer"), "{}", spec.name);
        assert!(
            ptx.contains(".max.u64") && ptx.contains(".add.u64"),
            "{}: no end-lane max or launch count",
            spec.name
        );
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
        c.args.extend(
            ring.next("add_f32", StreamId::DEFAULT)
                .expect("slot")
                .map(CaseArg::Scalar),
        );
        run_case(&mut exec, &c).expect("run");
    }
    let d = ring.collect(&mut exec).expect("records");
    assert_eq!(d.len(), 5);
    for w in d.windows(2) {
        assert!(
            w[0].start_ns < w[0].end_ns && w[0].end_ns <= w[1].start_ns,
            "{w:?}"
        );
    }
    let order = check_order(&d);
    assert_eq!((order.pairs, order.overlaps.len()), (4, 0));
    // The same records with the fourth moved back before the third's end: one overlap.
    let mut shifted = d.clone();
    shifted[3].start_ns = shifted[2].end_ns - 1;
    let order = check_order(&shifted);
    assert_eq!(order.overlaps.len(), 1);
    assert_eq!(
        (
            order.overlaps[0].first,
            order.overlaps[0].second,
            order.overlaps[0].by_ns
        ),
        (2, 3, 1)
    );
    // Collecting frees the slots, zeroed.
    ring.next("again", StreamId::DEFAULT).expect("slot");
    let again = ring.collect(&mut exec).expect("records");
    assert_eq!(
        (again[0].kernel.as_str(), again[0].end_ns, again[0].launches),
        ("again", 0, 0)
    );
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
    profiled.args.extend(
        ring.next("rmsnorm", StreamId::DEFAULT)
            .expect("slot")
            .map(CaseArg::Scalar),
    );
    let mut previous_end = 0;
    for run in 0..4 {
        run_case(&mut exec, &profiled).expect("run");
        let d = ring.read(&mut exec).expect("records");
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].launches, 1, "run {run}: {:?}", d[0]);
        assert!(
            (1..=most_lanes(&case)).contains(&d[0].lanes_ended),
            "run {run}: {:?}",
            d[0]
        );
        assert!(
            previous_end <= d[0].start_ns && d[0].start_ns < d[0].end_ns,
            "run {run}: {:?}",
            d[0]
        );
        previous_end = d[0].end_ns;
    }
    // Read again without a launch: no launch counted since, times unchanged.
    let again = ring.read(&mut exec).expect("records");
    assert_eq!(
        (again[0].launches, again[0].lanes_ended, again[0].end_ns),
        (0, 0, previous_end)
    );
}

#[test]
fn the_record_spans_every_block_and_counts_each_launch_once() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    for i in 0..4 {
        let grid = [
            rng.gen_range(1..6),
            rng.gen_range(1..4),
            rng.gen_range(1..3),
        ];
        let mut exec = InterpExecutor::new();
        // Once in blocks of two warps, whose second warp ends its body after the first.
        let run = match i {
            0 => GridRun::new(&mut exec, grid, [16, 2, 2], rng.gen()),
            _ => GridRun::random(&mut exec, &mut rng, grid),
        };
        let mut ring = Ring::new(&mut exec, rng.gen_range(1..40)).expect("ring");
        let slot = ring.next("grid_ids", StreamId::DEFAULT).expect("slot");
        let shape = format!("grid {grid:?}, block {:?}", run.block);
        let mut previous_end = 0;
        for launches in [1, 2] {
            for _ in 0..launches {
                run.launch(&mut exec, &slot);
            }
            let body = run.check_output(&mut exec);

            // Block 0 records its entry before its threads start their bodies (the
            // interpreter runs it first), and every block raises a lane to its end after
            // all its threads finished theirs: the record spans every body of the last
            // launch.
            let start = word(&mut exec, &slot, START_PLANE);
            let lanes: Vec<u64> = (0..LANES)
                .map(|l| word(&mut exec, &slot, FIRST_LANE_PLANE + l))
                .collect();
            let end = *lanes.iter().max().expect("lanes");
            assert!(
                previous_end < start && start <= body.block0_began,
                "{shape}: start {start}, {previous_end} before"
            );
            assert!(
                body.last_ended < end,
                "{shape}: end {end}, a body ended at {}",
                body.last_ended
            );
            // Lanes raised only by earlier launches hold earlier ends.
            let raised = lanes.iter().filter(|&&t| t >= start).count() as u32;
            assert!(
                (1..=run.most_lanes()).contains(&raised),
                "{shape}: {raised} lanes raised: {lanes:?}"
            );
            // Each launch counted once, by one thread of the whole grid.
            let d = &ring.read(&mut exec).expect("records")[0];
            assert_eq!(
                (d.start_ns, d.end_ns, d.launches, d.lanes_ended),
                (start, end, launches, raised),
                "{shape}"
            );
            assert_eq!(
                word(&mut exec, &slot, LAUNCH_PLANE),
                if launches == 1 { 1 } else { 3 },
                "{shape}"
            );
            previous_end = end;
        }
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
            GridRun::random(&mut exec, &mut rng, grid)
        })
        .collect();
    let mut ring = Ring::new(&mut exec, runs.len() as u32).expect("ring");
    let slots: Vec<[Arg; 2]> = runs
        .iter()
        .map(|_| ring.next("grid_ids", StreamId::DEFAULT).expect("slot"))
        .collect();
    exec.begin_capture(StreamId::DEFAULT).expect("capture");
    for (run, slot) in runs.iter().zip(&slots) {
        run.launch_only(&mut exec, slot);
    }
    let graph = exec.end_capture(StreamId::DEFAULT).expect("graph");
    let mut previous_end = 0;
    for replay in 0..4u32 {
        for run in &runs {
            run.poison(&mut exec);
        }
        exec.replay(graph, StreamId::DEFAULT).expect("replay");
        exec.synchronize().expect("sync");
        let bodies: Vec<_> = runs.iter().map(|run| run.check_output(&mut exec)).collect();
        let mut records = ring.read(&mut exec).expect("records");
        for ((r, run), body) in records.iter_mut().zip(&runs).zip(&bodies) {
            assert_eq!(r.launches, 1, "replay {replay}: {r:?}");
            assert!(
                r.start_ns <= body.block0_began && body.last_ended < r.end_ns,
                "replay {replay}: {r:?}"
            );
            assert!(
                (1..=run.most_lanes()).contains(&r.lanes_ended),
                "replay {replay}: {r:?}"
            );
            r.step = Some(replay);
        }
        let order = check_order(&records);
        assert_eq!(
            (order.pairs, order.overlaps.len()),
            (runs.len() - 1, 0),
            "replay {replay}: {records:?}"
        );
        assert!(
            previous_end <= records[0].start_ns,
            "replay {replay} began before the previous one ended"
        );
        previous_end = records.last().expect("records").end_ns;
    }
}
