//! The executor contract as a set of checks that run on any backend.
//!
//! The kernel is `y[i] = fma(a, x[i], y[i])` for `i < n`, built with the IR builder.
//! Inputs are random from a seed that is printed (set `QUENCH_TEST_SEED` to repeat a
//! run); host buffers receiving results are poisoned first, and every element is
//! compared bit for bit with a reference computed here.

#![allow(dead_code)] // each test binary uses a different subset

use quench_ir::{AddrSpace, Builder, Function, Scalar, Type};
use quench_rt::{Arg, DevicePtr, Executor, KernelId, Launch, RtError, StreamId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub const BLOCK: u32 = 128;
/// A NaN with a payload no arithmetic produces.
pub const POISON: u32 = 0x7fc0_dead;

pub fn saxpy() -> Function {
    let mut k = Builder::new("saxpy", BLOCK);
    let x = k.param("x", Type::Ptr(AddrSpace::Global, Scalar::F32));
    let y = k.param("y", Type::Ptr(AddrSpace::Global, Scalar::F32));
    let a = k.param("a", Type::F32);
    let n = k.param("n", Type::U32);
    let i = k.global_id_x();
    let inside = k.lt(i, n);
    k.if_then(inside, |k| {
        let px = k.ptr_add(x, i);
        let py = k.ptr_add(y, i);
        let vx = k.load(Type::F32, px);
        let vy = k.load(Type::F32, py);
        let r = k.fma(a, vx, vy);
        k.store(py, r);
    });
    k.finish().expect("saxpy verifies")
}

pub fn rng(test: &str) -> ChaCha8Rng {
    let seed = std::env::var("QUENCH_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    println!("{test}: seed {seed} (QUENCH_TEST_SEED={seed} repeats it)");
    ChaCha8Rng::seed_from_u64(seed)
}

pub fn random_f32(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-4.0f32..4.0)).collect()
}

pub fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn upload(ex: &mut dyn Executor, v: &[f32]) -> DevicePtr {
    let p = ex.alloc(v.len() as u64 * 4).expect("alloc");
    ex.copy_to_device(p, &to_bytes(v)).expect("copy to device");
    p
}

/// Read `n` floats into a poisoned buffer.
pub fn download(ex: &mut dyn Executor, p: DevicePtr, n: usize) -> Vec<f32> {
    let mut bytes: Vec<u8> = std::iter::repeat_n(POISON.to_le_bytes(), n)
        .flatten()
        .collect();
    ex.copy_to_host(p, &mut bytes).expect("copy to host");
    from_bytes(&bytes)
}

pub fn assert_bits_eq(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

/// A saxpy problem on the device: `n` live elements plus a guard tail the kernel
/// must not touch.
pub struct Problem {
    pub n: usize,
    pub tail: usize,
    pub a: f32,
    pub x: Vec<f32>,
    pub y: Vec<f32>,
    pub dx: DevicePtr,
    pub dy: DevicePtr,
}

impl Problem {
    pub fn new(ex: &mut dyn Executor, rng: &mut ChaCha8Rng, n: usize) -> Problem {
        let tail = 37;
        let x = random_f32(rng, n + tail);
        let y = random_f32(rng, n + tail);
        let a = rng.gen_range(-2.0f32..2.0);
        let dx = upload(ex, &x);
        let dy = upload(ex, &y);
        Problem {
            n,
            tail,
            a,
            x,
            y,
            dx,
            dy,
        }
    }

    pub fn args(&self) -> Vec<Arg> {
        vec![
            Arg::Ptr(self.dx),
            Arg::Ptr(self.dy),
            Arg::F32(self.a),
            Arg::U32(self.n as u32),
        ]
    }

    pub fn launch(&self) -> Launch {
        Launch::linear((self.n as u32).div_ceil(BLOCK), BLOCK)
    }

    /// `y` after `times` applications of the kernel.
    pub fn expected(&self, times: usize) -> Vec<f32> {
        let mut y = self.y.clone();
        for _ in 0..times {
            for (yi, xi) in y.iter_mut().zip(&self.x).take(self.n) {
                *yi = self.a.mul_add(*xi, *yi);
            }
        }
        y
    }

    pub fn check(&self, ex: &mut dyn Executor, times: usize, what: &str) {
        let got = download(ex, self.dy, self.n + self.tail);
        assert_bits_eq(&got, &self.expected(times), what);
    }
}

// ---- the checks ---------------------------------------------------------------------

/// Alloc, copy in, launch, copy back, compare; then device-to-device copy.
pub fn saxpy_runs(ex: &mut dyn Executor) {
    let mut rng = rng("saxpy_runs");
    let k = ex.load(&saxpy()).expect("load");
    for n in [1usize, 127, 128, 1000] {
        let p = Problem::new(ex, &mut rng, n);
        ex.launch(k, &p.launch(), &p.args(), StreamId::DEFAULT)
            .expect("launch");
        ex.synchronize().expect("synchronize");
        p.check(ex, 1, &format!("saxpy n={n}"));

        let copy = ex.alloc((n + p.tail) as u64 * 4).expect("alloc");
        ex.copy_device_to_device(copy, p.dy, (n + p.tail) as u64 * 4)
            .expect("d2d");
        assert_bits_eq(
            &download(ex, copy, n + p.tail),
            &p.expected(1),
            "device-to-device copy",
        );
        for d in [p.dx, p.dy, copy] {
            ex.free(d).expect("free");
        }
    }
}

/// Wrong count, wrong types, dangling pointers, unknown handles: each refused by name.
pub fn bad_arguments_are_refused(ex: &mut dyn Executor) {
    let mut rng = rng("bad_arguments_are_refused");
    let k = ex.load(&saxpy()).expect("load");
    let p = Problem::new(ex, &mut rng, 64);
    let l = p.launch();
    let s = StreamId::DEFAULT;

    match ex.launch(k, &l, &p.args()[..3], s) {
        Err(RtError::ArgCount {
            kernel,
            expected: 4,
            given: 3,
        }) => assert_eq!(kernel, "saxpy"),
        other => panic!("missing argument: {other:?}"),
    }
    let mut too_many = p.args();
    too_many.push(Arg::U32(0));
    assert!(matches!(
        ex.launch(k, &l, &too_many, s),
        Err(RtError::ArgCount {
            expected: 4,
            given: 5,
            ..
        })
    ));

    let cases: [(usize, Arg, &str, &str); 4] = [
        (2, Arg::F64(1.0), "a", "f32"),
        (3, Arg::I32(64), "n", "u32"),
        (0, Arg::U64(p.dx.addr()), "x", "ptr<global, f32>"),
        (2, Arg::Ptr(p.dx), "a", "f32"),
    ];
    for (index, arg, name, want) in cases {
        let mut args = p.args();
        args[index] = arg;
        let err = ex
            .launch(k, &l, &args, s)
            .expect_err("a mistyped argument is refused");
        let msg = err.to_string();
        match err {
            RtError::ArgType {
                index: i,
                param,
                expected,
                ..
            } => {
                assert_eq!((i, param.as_str(), expected.as_str()), (index, name, want))
            }
            other => panic!("argument {index} as {arg:?}: {other:?}"),
        }
        assert!(
            msg.contains(&format!("argument {index} (`{name}`)")) && msg.contains(want),
            "{msg}"
        );
    }

    let mut dangling = p.args();
    dangling[0] = Arg::Ptr(DevicePtr(0x10));
    assert!(matches!(
        ex.launch(k, &l, &dangling, s),
        Err(RtError::Memory { .. })
    ));

    let unknown = KernelId(u32::MAX);
    assert!(matches!(
        ex.abi(unknown),
        Err(RtError::UnknownHandle { kind: "kernel", .. })
    ));
    assert!(matches!(
        ex.launch(unknown, &l, &p.args(), s),
        Err(RtError::UnknownHandle { kind: "kernel", .. })
    ));
    let stray = StreamId(u32::MAX);
    assert!(matches!(
        ex.launch(k, &l, &p.args(), stray),
        Err(RtError::UnknownHandle { kind: "stream", .. })
    ));

    // Nothing ran: y is as uploaded.
    p.check(ex, 0, "after refused launches");

    // Memory misuse.
    assert!(matches!(ex.alloc(0), Err(RtError::Memory { .. })));
    assert!(matches!(
        ex.free(p.dx.offset(4)),
        Err(RtError::Memory { .. })
    ));
    let mut big = vec![0u8; (64 + p.tail) * 4 + 1];
    assert!(matches!(
        ex.copy_to_host(p.dy, &mut big),
        Err(RtError::Memory { .. })
    ));
    assert!(matches!(
        ex.copy_to_device(p.dy.offset(4), &big[..(64 + p.tail) * 4]),
        Err(RtError::Memory { .. })
    ));
    ex.free(p.dx).expect("free");
    assert!(
        matches!(ex.free(p.dx), Err(RtError::Memory { .. })),
        "double free"
    );
    assert!(
        matches!(ex.launch(k, &l, &p.args(), s), Err(RtError::Memory { .. })),
        "use after free"
    );
}

/// Shapes outside the kernel's or the device's limits are refused before launch.
pub fn bad_shapes_are_refused(ex: &mut dyn Executor) {
    let mut rng = rng("bad_shapes_are_refused");
    let k = ex.load(&saxpy()).expect("load");
    let p = Problem::new(ex, &mut rng, 64);
    let ok = p.launch();
    let shapes = [
        (
            "empty grid",
            Launch {
                grid: [0, 1, 1],
                ..ok
            },
        ),
        (
            "empty block",
            Launch {
                block: [BLOCK, 0, 1],
                ..ok
            },
        ),
        (
            "block over the kernel's bound",
            Launch {
                block: [BLOCK * 2, 1, 1],
                ..ok
            },
        ),
        (
            "block over the kernel's bound in 2-D",
            Launch {
                block: [BLOCK, 2, 1],
                ..ok
            },
        ),
        (
            "block.x over 1024",
            Launch {
                block: [1025, 1, 1],
                ..ok
            },
        ),
        (
            "block.z over 64",
            Launch {
                block: [1, 1, 65],
                ..ok
            },
        ),
        (
            "grid.x at 2^31",
            Launch {
                grid: [1 << 31, 1, 1],
                ..ok
            },
        ),
        (
            "grid.y at 65536",
            Launch {
                grid: [1, 65536, 1],
                ..ok
            },
        ),
        (
            "grid.z at 65536",
            Launch {
                grid: [1, 1, 65536],
                ..ok
            },
        ),
        (
            "shared memory over 227 KiB",
            Launch {
                dynamic_shared_bytes: 227 * 1024 + 1,
                ..ok
            },
        ),
    ];
    for (what, l) in shapes {
        match ex.launch(k, &l, &p.args(), StreamId::DEFAULT) {
            Err(RtError::LaunchShape { kernel, message }) => {
                assert_eq!(kernel, "saxpy");
                assert!(!message.is_empty());
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    p.check(ex, 0, "after refused shapes");

    // Just inside the limit runs (on a GPU this needs the opt-in attribute).
    let roomy = Launch {
        dynamic_shared_bytes: 227 * 1024,
        ..ok
    };
    ex.launch(k, &roomy, &p.args(), StreamId::DEFAULT)
        .expect("227 KiB of shared memory");
    p.check(
        ex,
        1,
        "after a launch with 227 KiB of dynamic shared memory",
    );
}

/// Launches on a capturing stream are recorded, not run; each replay runs them.
pub fn capture_and_replay(ex: &mut dyn Executor) {
    let mut rng = rng("capture_and_replay");
    let k = ex.load(&saxpy()).expect("load");
    let p = Problem::new(ex, &mut rng, 300);
    let s = ex.create_stream().expect("stream");

    assert!(
        matches!(ex.end_capture(s), Err(RtError::Capture { .. })),
        "end without begin"
    );
    ex.begin_capture(s).expect("begin");
    assert!(
        matches!(ex.begin_capture(s), Err(RtError::Capture { .. })),
        "begin twice"
    );
    ex.launch(k, &p.launch(), &p.args(), s)
        .expect("recorded launch");
    ex.launch(k, &p.launch(), &p.args(), s)
        .expect("recorded launch");
    // What a graph cannot hold is refused while the capture is open.
    let mut host = vec![0u8; 4];
    assert!(matches!(
        ex.copy_to_host(p.dy, &mut host),
        Err(RtError::Capture { .. })
    ));
    assert!(matches!(ex.alloc(16), Err(RtError::Capture { .. })));
    assert!(matches!(ex.synchronize(), Err(RtError::Capture { .. })));
    assert!(matches!(ex.record_event(s), Err(RtError::Capture { .. })));
    // A bad launch is refused, not recorded.
    assert!(matches!(
        ex.launch(k, &p.launch(), &p.args()[..1], s),
        Err(RtError::ArgCount { .. })
    ));
    let g = ex.end_capture(s).expect("end");

    ex.synchronize().expect("synchronize");
    p.check(ex, 0, "captured launches did not run");
    for times in 1..=3 {
        ex.replay(g, s).expect("replay");
        ex.synchronize().expect("synchronize");
        p.check(ex, 2 * times, &format!("after replay {times}"));
    }
    ex.release_graph(g).expect("release");
    assert!(matches!(
        ex.replay(g, s),
        Err(RtError::UnknownHandle { kind: "graph", .. })
    ));
    assert!(matches!(
        ex.release_graph(g),
        Err(RtError::UnknownHandle { kind: "graph", .. })
    ));
}

/// Events: elapsed time is non-negative, zero from an event to itself, and released
/// events are unknown. Returns the time measured around one launch.
pub fn events_measure(ex: &mut dyn Executor) -> f32 {
    let mut rng = rng("events_measure");
    let k = ex.load(&saxpy()).expect("load");
    let p = Problem::new(ex, &mut rng, 1000);
    let s = ex.create_stream().expect("stream");
    let e0 = ex.record_event(s).expect("event");
    ex.launch(k, &p.launch(), &p.args(), s).expect("launch");
    let e1 = ex.record_event(s).expect("event");
    let ms = ex.elapsed_ms(e0, e1).expect("elapsed");
    assert!(ms >= 0.0 && ms.is_finite(), "{ms}");
    assert_eq!(ex.elapsed_ms(e1, e1).expect("elapsed"), 0.0);
    p.check(ex, 1, "after the timed launch");
    ex.release_event(e0).expect("release");
    assert!(matches!(
        ex.elapsed_ms(e0, e1),
        Err(RtError::UnknownHandle { kind: "event", .. })
    ));
    assert!(matches!(
        ex.release_event(e0),
        Err(RtError::UnknownHandle { kind: "event", .. })
    ));
    ms
}

/// Every contract check, in order.
pub fn all(ex: &mut dyn Executor) {
    saxpy_runs(ex);
    bad_arguments_are_refused(ex);
    bad_shapes_are_refused(ex);
    capture_and_replay(ex);
    events_measure(ex);
}
