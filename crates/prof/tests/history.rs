//! A history of ring copies behind a replayed graph: a run of more steps than the history
//! holds, read back whenever it fills and once more at the end (a partial batch), gives
//! for every step exactly the records the ring held right after that step, in order.

use quench_prof::order::check_order;
use quench_prof::{
    Dispatch, History, RingError, FIRST_LANE_PLANE, LAUNCH_PLANE, PLANES, START_PLANE,
};
use quench_rt::{Arg, Executor, InterpExecutor, StreamId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;

use common::{seed, word, GridRun};

/// The record of `slot` as the ring holds it now, read word by word, given its launch
/// counter when the previous copy was made; and the counter now.
fn record_now(
    exec: &mut InterpExecutor,
    slot: &[Arg; 2],
    kernel: &str,
    counter_before: u64,
) -> (Dispatch, u64) {
    let counter = word(exec, slot, LAUNCH_PLANE);
    let start_ns = word(exec, slot, START_PLANE);
    let lanes: Vec<u64> = (FIRST_LANE_PLANE..PLANES)
        .map(|p| word(exec, slot, p))
        .collect();
    let launches = counter - counter_before;
    let d = Dispatch {
        kernel: kernel.to_string(),
        start_ns,
        end_ns: lanes.iter().copied().max().unwrap_or(0),
        launches,
        lanes_ended: match launches {
            0 => 0,
            _ => lanes.iter().filter(|&&t| t != 0 && t >= start_ns).count() as u32,
        },
        ..Dispatch::default()
    };
    (d, counter)
}

/// End a step as a decoder does: the history's copy dispatch after the step's launches.
fn copy(exec: &mut InterpExecutor, history: &mut History) {
    let c = history.copy_dispatch().clone();
    exec.launch(c.kernel, &c.launch, &c.args, StreamId::DEFAULT)
        .expect("copy");
    history.copied().expect("copied");
}

#[test]
fn a_run_longer_than_the_history_reads_every_step_in_batches() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let kept: u32 = rng.gen_range(2..=5);
    let mut steps = rng.gen_range(kept + 1..=3 * kept);
    if steps.is_multiple_of(kept) {
        steps += 1;
    }
    eprintln!("{steps} steps, {kept} kept on the device");
    let mut exec = InterpExecutor::new();
    let mut history = History::new(&mut exec, 6, kept).expect("history");

    // A step of three dispatches, captured and replayed with the same slots.
    let runs: Vec<GridRun> = (0..3)
        .map(|_| {
            let grid = [rng.gen_range(1..10), rng.gen_range(1..3), 1];
            GridRun::random(&mut exec, &mut rng, grid)
        })
        .collect();
    let mut slots: Vec<[Arg; 2]> = runs
        .iter()
        .map(|_| history.next("grid_ids", StreamId::DEFAULT).expect("slot"))
        .collect();
    exec.begin_capture(StreamId::DEFAULT).expect("capture");
    for (run, slot) in runs.iter().zip(&slots) {
        run.launch_only(&mut exec, slot);
    }
    let graph = exec.end_capture(StreamId::DEFAULT).expect("graph");
    // A fourth dispatch, launched on its own, takes a slot from a later step on: the
    // copies made before hold no record of it.
    let late_grid = [rng.gen_range(1..10), 1, 1];
    let late = GridRun::random(&mut exec, &mut rng, late_grid);
    let late_from = rng.gen_range(1..steps);

    let mut expected: Vec<Vec<Dispatch>> = vec![];
    let mut read: Vec<Vec<Dispatch>> = vec![];
    let mut counters = [0u64; 4];
    for step in 0..steps {
        if step == late_from {
            slots.push(history.next("late", StreamId::DEFAULT).expect("slot"));
        }
        // Now and then a step's graph runs twice before its copy: both launches count.
        let replays = if rng.gen_bool(0.25) { 2 } else { 1 };
        let mut bodies = vec![];
        for _ in 0..replays {
            for run in &runs {
                run.poison(&mut exec);
            }
            exec.replay(graph, StreamId::DEFAULT).expect("replay");
            bodies = runs.iter().map(|run| run.check_output(&mut exec)).collect();
        }
        if let Some(slot) = slots.get(3) {
            late.launch(&mut exec, slot);
            bodies.push(late.check_output(&mut exec));
        }
        let mut now = vec![];
        for (i, (slot, body)) in slots.iter().zip(&bodies).enumerate() {
            let (kernel, run, launches) = match runs.get(i) {
                Some(run) => ("grid_ids", run, replays),
                None => ("late", &late, 1),
            };
            let (d, counter) = record_now(&mut exec, slot, kernel, counters[i]);
            counters[i] = counter;
            assert_eq!(d.launches, launches, "step {step}: {d:?}");
            assert!(
                (1..=run.most_lanes()).contains(&d.lanes_ended),
                "step {step}: {d:?}"
            );
            assert!(
                d.start_ns <= body.block0_began && body.last_ended < d.end_ns,
                "step {step}: {d:?}"
            );
            now.push(d);
        }
        expected.push(now);

        copy(&mut exec, &mut history);
        if history.is_full() {
            match history.copied() {
                Err(RingError::HistoryFull { steps }) => assert_eq!(steps, kept),
                other => panic!("a copy into a full history: {other:?}"),
            }
            let batch = history.read(&mut exec).expect("read");
            assert_eq!(batch.len() as u32, kept);
            read.extend(batch);
            assert_eq!(history.copies(), 0);
        }
    }
    let last = history.read(&mut exec).expect("read");
    assert_eq!(last.len() as u32, steps % kept, "the partial last batch");
    read.extend(last);
    assert!(history.read(&mut exec).expect("read").is_empty());

    assert_eq!(read.len(), expected.len());
    for (step, (got, want)) in read.iter().zip(&expected).enumerate() {
        assert_eq!(got, want, "step {step}");
    }
    // The steps' dispatches ran one after another, and each step after the previous one.
    let flat: Vec<Dispatch> = read
        .into_iter()
        .flatten()
        .map(|d| Dispatch { step: Some(0), ..d })
        .collect();
    let order = check_order(&flat);
    assert!(order.overlaps.is_empty(), "{:?}", order.overlaps);
    assert_eq!(order.pairs, flat.len() - 1);
    history.release(&mut exec).expect("free");
}

#[test]
fn a_history_needs_room() {
    let mut exec = InterpExecutor::new();
    assert!(matches!(
        History::new(&mut exec, 4, 0),
        Err(RingError::HistoryEmpty)
    ));
    let mut history = History::new(&mut exec, 1, 1).expect("history");
    assert!(history.read(&mut exec).expect("nothing to read").is_empty());
    copy(&mut exec, &mut history);
    assert!(matches!(
        history.copied(),
        Err(RingError::HistoryFull { steps: 1 })
    ));
    // A copy of a ring whose slots were all free holds no record.
    assert_eq!(
        history.read(&mut exec).expect("read"),
        vec![Vec::<Dispatch>::new()]
    );
    history.release(&mut exec).expect("free");
}

#[test]
fn the_history_copy_kernel_assembles() {
    if quench_testkit::ok(quench_ptx::ptxas::find_ptxas()).is_none() {
        return;
    }
    let ptx = quench_ptx::emit(&quench_prof::history::copy_kernel()).expect("emits");
    quench_ptx::ptxas::assemble(&ptx, "sm_90").expect("assembles");
}
