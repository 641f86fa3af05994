//! Kernel cases: a kernel with its launch, its input data, and the outputs it must
//! produce — the unit that tests (through the interpreter) and GPU checks (through the
//! CUDA executor) both run.
//!
//! [`run_case`] uploads the inputs, fills every output with a poison pattern (0xFF bytes:
//! a NaN in every float format) — except outputs updated in place, which start from their
//! given contents — launches, and reads the outputs back; [`compare`] checks every
//! element of every expected output.

use quench_ir::{Function, Scalar};
use quench_rt::{Arg, DevicePtr, Executor, Launch, RtError, StreamId};

use crate::data::decode;

/// The byte every output is filled with before a launch.
pub const POISON: u8 = 0xFF;

/// A device buffer of a case.
#[derive(Clone, Debug, PartialEq)]
pub struct Buffer {
    pub name: String,
    /// What is uploaded before the launch: the input data, or for an output the poison
    /// pattern (so that its length is the output's size).
    pub data: Vec<u8>,
    /// Outputs are read back after the launch.
    pub output: bool,
    /// Whether the buffer is filled with the poison pattern before each launch (plain
    /// outputs) rather than with `data` (inputs, and outputs updated in place).
    pub poisoned: bool,
}

impl Buffer {
    pub fn input(name: &str, data: Vec<u8>) -> Buffer {
        Buffer {
            name: name.to_string(),
            data,
            output: false,
            poisoned: false,
        }
    }

    pub fn output(name: &str, bytes: usize) -> Buffer {
        Buffer {
            name: name.to_string(),
            data: vec![POISON; bytes],
            output: true,
            poisoned: true,
        }
    }

    /// A buffer the kernel reads and overwrites in place (a residual stream, a cache):
    /// uploaded with `data`, read back after the launch. Its expected contents must differ
    /// from `data` wherever the kernel writes, or the check could not see a missing write.
    pub fn in_out(name: &str, data: Vec<u8>) -> Buffer {
        Buffer {
            name: name.to_string(),
            data,
            output: true,
            poisoned: false,
        }
    }
}

/// One kernel argument of a case.
#[derive(Clone, Debug, PartialEq)]
pub enum CaseArg {
    /// The device address of buffer `i` of the case.
    Buffer(usize),
    Scalar(Arg),
}

/// How an output is judged.
#[derive(Clone, Debug, PartialEq)]
pub enum Check {
    /// Bit-for-bit equality: the reference reproduces the kernel's operation order.
    Exact,
    /// `|got[i] − want[i]| ≤ tol[i]` for every element, with the tolerance derived from
    /// the approximations the kernel uses; `explain` says how.
    Bound { tol: Vec<f64>, explain: String },
}

/// The reference contents of one output buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct Expected {
    /// Index into [`KernelCase::buffers`].
    pub buffer: usize,
    pub data: Vec<u8>,
    pub elem: Scalar,
    pub check: Check,
}

/// A deliberately wrong reference (same buffer, element type and check as the expected
/// output it shadows) and what is wrong with it.
#[derive(Clone, Debug, PartialEq)]
pub struct Control {
    pub what: String,
    pub expected: Expected,
}

/// A kernel, a launch, and the data to judge it by.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelCase {
    /// Library name of the kernel (`gemv_bf16`).
    pub name: String,
    /// The problem size as text (`8192x8192`).
    pub shape: String,
    pub kernel: Function,
    pub launch: Launch,
    pub buffers: Vec<Buffer>,
    pub args: Vec<CaseArg>,
    pub expected: Vec<Expected>,
    /// For kernels judged by a bound: deliberately wrong references that the output must
    /// fail, showing that the bound is tight enough to catch such a mistake.
    pub controls: Vec<Control>,
    /// Bytes the kernel must move to or from device memory at least (each input read
    /// once, each output written once): the basis of bandwidth figures.
    pub bytes_moved: u64,
    /// Floating-point operations (a multiply-add counts two).
    pub flops: u64,
}

impl KernelCase {
    /// GB/s (10^9 bytes per second) at `ms` milliseconds per launch.
    pub fn gbps(&self, ms: f64) -> f64 {
        self.bytes_moved as f64 / (ms * 1e-3) / 1e9
    }

    /// TFLOP/s at `ms` milliseconds per launch.
    pub fn tflops(&self, ms: f64) -> f64 {
        self.flops as f64 / (ms * 1e-3) / 1e12
    }
}

/// What a run of a case produced: the contents of each output buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct CaseOutputs {
    /// `(buffer index, bytes)` for every output buffer, in buffer order.
    pub outputs: Vec<(usize, Vec<u8>)>,
}

impl CaseOutputs {
    pub fn get(&self, buffer: usize) -> Option<&[u8]> {
        self.outputs
            .iter()
            .find(|(i, _)| *i == buffer)
            .map(|(_, d)| d.as_slice())
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CaseError {
    #[error("case `{case}`: {source}")]
    Runtime {
        case: String,
        #[source]
        source: Box<RtError>,
    },
    /// The case itself is inconsistent (an argument naming a buffer that does not exist,
    /// an expected output of the wrong size, ...).
    #[error("case `{case}` is malformed: {message}")]
    Malformed { case: String, message: String },
}

/// Device buffers of one run, in case buffer order; [`release`] frees them.
struct Allocated {
    ptrs: Vec<DevicePtr>,
}

fn release(exec: &mut dyn Executor, a: Allocated) -> Result<(), RtError> {
    let mut first_err = None;
    for p in a.ptrs {
        if let Err(e) = exec.free(p) {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

fn rt(case: &KernelCase) -> impl Fn(RtError) -> CaseError + '_ {
    move |source| CaseError::Runtime {
        case: case.name.clone(),
        source: Box::new(source),
    }
}

/// Allocate every buffer and upload its contents (inputs and in-place outputs as given,
/// other outputs poisoned).
fn upload(
    exec: &mut dyn Executor,
    case: &KernelCase,
    alloc: &mut Allocated,
) -> Result<(), CaseError> {
    for b in &case.buffers {
        // A zero-sized buffer still gets an address; executors refuse empty allocations.
        let p = exec.alloc(b.data.len().max(1) as u64).map_err(rt(case))?;
        alloc.ptrs.push(p);
        if b.poisoned {
            exec.copy_to_device(p, &vec![POISON; b.data.len()])
                .map_err(rt(case))?;
        } else if !b.data.is_empty() {
            exec.copy_to_device(p, &b.data).map_err(rt(case))?;
        }
    }
    Ok(())
}

fn args(case: &KernelCase, ptrs: &[DevicePtr]) -> Result<Vec<Arg>, CaseError> {
    case.args
        .iter()
        .enumerate()
        .map(|(i, a)| match a {
            CaseArg::Scalar(s) => Ok(*s),
            CaseArg::Buffer(b) => {
                ptrs.get(*b)
                    .map(|p| Arg::Ptr(*p))
                    .ok_or_else(|| CaseError::Malformed {
                        case: case.name.clone(),
                        message: format!(
                            "argument {i} names buffer {b}, but the case has {} buffers",
                            ptrs.len()
                        ),
                    })
            }
        })
        .collect()
}

/// Run a case once: allocate, upload inputs, poison outputs, launch, synchronize, read
/// the outputs back, free. The device memory is freed on failure too.
pub fn run_case(exec: &mut dyn Executor, case: &KernelCase) -> Result<CaseOutputs, CaseError> {
    let mut alloc = Allocated { ptrs: vec![] };
    let result = run_in(exec, case, &mut alloc);
    let freed = release(exec, alloc).map_err(rt(case));
    let out = result?;
    freed?;
    Ok(out)
}

fn run_in(
    exec: &mut dyn Executor,
    case: &KernelCase,
    alloc: &mut Allocated,
) -> Result<CaseOutputs, CaseError> {
    upload(exec, case, alloc)?;
    let args = args(case, &alloc.ptrs)?;
    let k = exec.load(&case.kernel).map_err(rt(case))?;
    exec.launch(k, &case.launch, &args, StreamId::DEFAULT)
        .map_err(rt(case))?;
    exec.synchronize().map_err(rt(case))?;
    let mut outputs = vec![];
    for (i, b) in case.buffers.iter().enumerate().filter(|(_, b)| b.output) {
        let mut data = vec![0u8; b.data.len()];
        if !data.is_empty() {
            exec.copy_to_host(alloc.ptrs[i], &mut data)
                .map_err(rt(case))?;
        }
        outputs.push((i, data));
    }
    Ok(CaseOutputs { outputs })
}

/// Launch timing of a case, per launch, from events around groups of launches.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub reps: u32,
}

/// Launches per timed group: a single launch between two events would also count the
/// host's submission gap after the first event, which is a large share of a 30 µs
/// kernel; back-to-back launches are also how kernels run inside a model's step.
pub const LAUNCHES_PER_GROUP: u32 = 10;

/// Time a case: `warmup` launches, then `reps` (≥ 1) groups of [`LAUNCHES_PER_GROUP`]
/// back-to-back launches, each group between two events; a repeat's time is its group's
/// time over the launches, and the median repeat is the figure to quote. Inputs are
/// uploaded once; outputs are not read.
pub fn time_case(
    exec: &mut dyn Executor,
    case: &KernelCase,
    warmup: u32,
    reps: u32,
) -> Result<Timing, CaseError> {
    if reps == 0 {
        return Err(CaseError::Malformed {
            case: case.name.clone(),
            message: "timing needs at least one repeat".into(),
        });
    }
    let mut alloc = Allocated { ptrs: vec![] };
    let result = time_in(exec, case, &mut alloc, warmup, reps);
    let freed = release(exec, alloc).map_err(rt(case));
    let out = result?;
    freed?;
    Ok(out)
}

fn time_in(
    exec: &mut dyn Executor,
    case: &KernelCase,
    alloc: &mut Allocated,
    warmup: u32,
    reps: u32,
) -> Result<Timing, CaseError> {
    upload(exec, case, alloc)?;
    let args = args(case, &alloc.ptrs)?;
    let k = exec.load(&case.kernel).map_err(rt(case))?;
    let s = StreamId::DEFAULT;
    for _ in 0..warmup {
        exec.launch(k, &case.launch, &args, s).map_err(rt(case))?;
    }
    exec.synchronize().map_err(rt(case))?;
    let mut ms = Vec::with_capacity(reps as usize);
    for _ in 0..reps {
        let start = exec.record_event(s).map_err(rt(case))?;
        for _ in 0..LAUNCHES_PER_GROUP {
            exec.launch(k, &case.launch, &args, s).map_err(rt(case))?;
        }
        let end = exec.record_event(s).map_err(rt(case))?;
        let t = exec.elapsed_ms(start, end).map_err(rt(case));
        exec.release_event(start).map_err(rt(case))?;
        exec.release_event(end).map_err(rt(case))?;
        ms.push(t? as f64 / LAUNCHES_PER_GROUP as f64);
    }
    ms.sort_by(f64::total_cmp);
    let n = ms.len();
    let median = if n % 2 == 1 {
        ms[n / 2]
    } else {
        (ms[n / 2 - 1] + ms[n / 2]) / 2.0
    };
    Ok(Timing {
        median_ms: median,
        min_ms: ms[0],
        max_ms: ms[n - 1],
        reps,
    })
}

/// One element that failed its check.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    pub index: usize,
    pub got: f64,
    pub want: f64,
    /// The element's tolerance (0 for an exact check).
    pub tol: f64,
}

/// The outcome of checking one output.
#[derive(Clone, Debug, PartialEq)]
pub struct CompareReport {
    pub buffer: String,
    pub elements: usize,
    pub max_abs_err: f64,
    /// Largest |got − want| / |want| over elements with `want` ≠ 0.
    pub max_rel_err: f64,
    /// For a bound: the largest |got − want| / tol (≤ 1 when it passes); 0 for exact.
    pub max_err_over_tol: f64,
    pub bit_exact: bool,
    /// How many elements failed the check (NaN in `got` always fails).
    pub mismatches: usize,
    /// The first few failures, in index order.
    pub first_mismatches: Vec<Mismatch>,
    pub passed: bool,
}

/// How many failing elements a report lists.
const LISTED: usize = 8;

/// Check every expected output of `case` against what a run produced.
pub fn compare(case: &KernelCase, out: &CaseOutputs) -> Result<Vec<CompareReport>, CaseError> {
    case.expected
        .iter()
        .map(|e| check_one(case, e, out))
        .collect()
}

/// Check the output against every control of `case`: each report must come out failed
/// (`passed == false`) for the bound to have shown its teeth.
pub fn compare_controls(
    case: &KernelCase,
    out: &CaseOutputs,
) -> Result<Vec<(String, CompareReport)>, CaseError> {
    case.controls
        .iter()
        .map(|c| Ok((c.what.clone(), check_one(case, &c.expected, out)?)))
        .collect()
}

fn check_one(
    case: &KernelCase,
    e: &Expected,
    out: &CaseOutputs,
) -> Result<CompareReport, CaseError> {
    let malformed = |message: String| CaseError::Malformed {
        case: case.name.clone(),
        message,
    };
    let name = case
        .buffers
        .get(e.buffer)
        .map(|b| b.name.clone())
        .ok_or_else(|| {
            malformed(format!(
                "an expected output names buffer {}, which does not exist",
                e.buffer
            ))
        })?;
    let got = out.get(e.buffer).ok_or_else(|| {
        malformed(format!(
            "buffer `{name}` has an expected value but is not an output"
        ))
    })?;
    compare_expected(&name, e, got).map_err(malformed)
}

/// Check one output's bytes against an expectation (a reference or a deliberately wrong
/// control). Errors name a size or type mismatch.
pub fn compare_expected(buffer: &str, e: &Expected, got: &[u8]) -> Result<CompareReport, String> {
    if got.len() != e.data.len() {
        return Err(format!(
            "output `{buffer}` has {} bytes, the reference {}",
            got.len(),
            e.data.len()
        ));
    }
    let (g, w) = match (decode(e.elem, got), decode(e.elem, &e.data)) {
        (Some(g), Some(w)) => (g, w),
        _ => {
            return Err(format!(
                "output `{buffer}`: element type {} cannot be compared",
                e.elem
            ))
        }
    };
    if let Check::Bound { tol, .. } = &e.check {
        if tol.len() != w.len() {
            return Err(format!(
                "output `{buffer}` has {} elements but {} tolerances",
                w.len(),
                tol.len()
            ));
        }
    }
    let size = e.elem.bytes() as usize;
    let mut r = CompareReport {
        buffer: buffer.to_string(),
        elements: w.len(),
        max_abs_err: 0.0,
        max_rel_err: 0.0,
        max_err_over_tol: 0.0,
        bit_exact: got == e.data.as_slice(),
        mismatches: 0,
        first_mismatches: vec![],
        passed: false,
    };
    for i in 0..w.len() {
        let err = if g[i].is_nan() || w[i].is_nan() {
            if g[i].is_nan() && w[i].is_nan() {
                0.0
            } else {
                f64::INFINITY
            }
        } else if g[i] == w[i] {
            // Equal infinities included (their difference would be NaN).
            0.0
        } else {
            (g[i] - w[i]).abs()
        };
        r.max_abs_err = r.max_abs_err.max(err);
        if w[i] != 0.0 {
            r.max_rel_err = r.max_rel_err.max(err / w[i].abs());
        }
        let (ok, tol) = match &e.check {
            Check::Exact => (
                got[i * size..(i + 1) * size] == e.data[i * size..(i + 1) * size],
                0.0,
            ),
            Check::Bound { tol, .. } => {
                let ratio = if tol[i] > 0.0 {
                    err / tol[i]
                } else if err == 0.0 {
                    0.0
                } else {
                    f64::INFINITY
                };
                r.max_err_over_tol = r.max_err_over_tol.max(ratio);
                (!g[i].is_nan() && err <= tol[i], tol[i])
            }
        };
        if !ok {
            r.mismatches += 1;
            if r.first_mismatches.len() < LISTED {
                r.first_mismatches.push(Mismatch {
                    index: i,
                    got: g[i],
                    want: w[i],
                    tol,
                });
            }
        }
    }
    r.passed = r.mismatches == 0;
    Ok(r)
}

impl std::fmt::Display for CompareReport {
    /// One line, then one line per listed failure.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} ({} elements, {} failed; max abs err {:.3e}, max rel err {:.3e}, {}{})",
            self.buffer,
            if self.passed { "pass" } else { "FAIL" },
            self.elements,
            self.mismatches,
            self.max_abs_err,
            self.max_rel_err,
            if self.bit_exact {
                "bit-exact"
            } else {
                "not bit-exact"
            },
            if self.max_err_over_tol > 0.0 {
                format!(", worst err/tol {:.3}", self.max_err_over_tol)
            } else {
                String::new()
            },
        )?;
        for m in &self.first_mismatches {
            write!(
                f,
                "\n  [{}] got {:e}, want {:e}, tol {:e}",
                m.index, m.got, m.want, m.tol
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::f32_bytes;

    fn expected(want: &[f32], check: Check) -> Expected {
        Expected {
            buffer: 0,
            data: f32_bytes(want),
            elem: Scalar::F32,
            check,
        }
    }

    #[test]
    fn exact_check_catches_one_flipped_bit() {
        let want = [1.0f32, -2.5, 3.25];
        let mut got = f32_bytes(&want);
        let r = compare_expected("y", &expected(&want, Check::Exact), &got).unwrap();
        assert!(r.passed && r.bit_exact && r.max_abs_err == 0.0);
        got[4] ^= 1; // lowest mantissa bit of element 1
        let r = compare_expected("y", &expected(&want, Check::Exact), &got).unwrap();
        assert!(!r.passed && !r.bit_exact);
        assert_eq!(r.mismatches, 1);
        assert_eq!(r.first_mismatches[0].index, 1);
    }

    #[test]
    fn bound_check_uses_each_tolerance_and_fails_nan() {
        let want = [1.0f32, 100.0];
        let check = Check::Bound {
            tol: vec![0.01, 1.0],
            explain: String::new(),
        };
        let got = f32_bytes(&[1.005, 100.5]);
        let r = compare_expected("y", &expected(&want, check.clone()), &got).unwrap();
        assert!(r.passed && !r.bit_exact);
        assert!(
            (r.max_err_over_tol - 0.5).abs() < 1e-3,
            "{}",
            r.max_err_over_tol
        );
        let got = f32_bytes(&[1.02, 100.5]);
        assert!(
            !compare_expected("y", &expected(&want, check.clone()), &got)
                .unwrap()
                .passed
        );
        let poisoned = vec![POISON; 8];
        let r = compare_expected("y", &expected(&want, check), &poisoned).unwrap();
        assert_eq!(r.mismatches, 2);
    }

    #[test]
    fn equal_infinities_pass_a_bound() {
        let want = [f32::NEG_INFINITY, 1.0];
        let check = Check::Bound {
            tol: vec![0.0, 0.0],
            explain: String::new(),
        };
        let r = compare_expected("m", &expected(&want, check.clone()), &f32_bytes(&want)).unwrap();
        assert!(r.passed && r.max_abs_err == 0.0, "{r}");
        let got = f32_bytes(&[f32::INFINITY, 1.0]);
        assert!(
            !compare_expected("m", &expected(&want, check), &got)
                .unwrap()
                .passed
        );
    }

    #[test]
    fn sizes_must_agree() {
        let e = compare_expected("y", &expected(&[1.0], Check::Exact), &[0u8; 8]).unwrap_err();
        assert!(e.contains("8 bytes") && e.contains("4"), "{e}");
        let bad = Check::Bound {
            tol: vec![],
            explain: String::new(),
        };
        assert!(compare_expected("y", &expected(&[1.0], bad), &[0u8; 4]).is_err());
    }
}
