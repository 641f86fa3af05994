//! The executor contract on the interpreter backend.

mod common;

use quench_rt::{Executor, InterpExecutor, StreamId};

#[test]
fn saxpy_runs() {
    common::saxpy_runs(&mut InterpExecutor::new());
}

#[test]
fn bad_arguments_are_refused() {
    common::bad_arguments_are_refused(&mut InterpExecutor::new());
}

#[test]
fn bad_shapes_are_refused() {
    common::bad_shapes_are_refused(&mut InterpExecutor::new());
}

#[test]
fn capture_and_replay() {
    common::capture_and_replay(&mut InterpExecutor::new());
}

#[test]
fn events_measure() {
    common::events_measure(&mut InterpExecutor::new());
}

/// Interpreter events read the virtual clock: the elapsed time is exactly the clock's
/// advance over the launch.
#[test]
fn events_read_the_virtual_clock() {
    let mut ex = InterpExecutor::new();
    let mut rng = common::rng("events_read_the_virtual_clock");
    let k = ex.load(&common::saxpy()).expect("load");
    let p = common::Problem::new(&mut ex, &mut rng, 200);
    let before = ex.device().clock_ns;
    let e0 = ex.record_event(StreamId::DEFAULT).expect("event");
    ex.launch(k, &p.launch(), &p.args(), StreamId::DEFAULT)
        .expect("launch");
    let e1 = ex.record_event(StreamId::DEFAULT).expect("event");
    let after = ex.device().clock_ns;
    assert!(after > before, "the launch advanced the clock");
    assert!(ex
        .last_launch_stats()
        .is_some_and(|s| s.all_exact() && s.instructions > 0));
    let want = ((after - before) as f64 / 1e6) as f32;
    assert_eq!(ex.elapsed_ms(e0, e1).expect("elapsed"), want);
    assert_eq!(ex.elapsed_ms(e1, e0).expect("elapsed"), -want);
}

/// Replaying a graph into a capturing stream nests its launches in the new graph.
#[test]
fn replay_nests_in_a_capture() {
    let mut ex = InterpExecutor::new();
    let mut rng = common::rng("replay_nests_in_a_capture");
    let k = ex.load(&common::saxpy()).expect("load");
    let p = common::Problem::new(&mut ex, &mut rng, 150);
    let s = StreamId::DEFAULT;
    ex.begin_capture(s).expect("begin");
    ex.launch(k, &p.launch(), &p.args(), s).expect("launch");
    let inner = ex.end_capture(s).expect("end");
    ex.begin_capture(s).expect("begin");
    ex.replay(inner, s).expect("nested replay");
    ex.launch(k, &p.launch(), &p.args(), s).expect("launch");
    let outer = ex.end_capture(s).expect("end");
    p.check(&mut ex, 0, "nothing ran during the captures");
    ex.replay(outer, s).expect("replay");
    p.check(&mut ex, 2, "outer graph ran the inner launch and its own");
}
