//! Run every probe through an executor and turn the outputs into tables.

use std::collections::BTreeMap;

use quench_ir::Function;
use quench_rt::{Arg, Executor, Launch, StreamId};
use serde::{Deserialize, Serialize};

use crate::approx::{self, ApproxError};
use crate::mma_layout::{self, LdMatrixEntry, MmaLayout, MmaMeasurement};
use crate::probe_kernels::{self, ApproxOp, MmaElem, LDMATRIX_VARIANTS};
use crate::IsaError;
use quench_ir::FragRole;

pub const LAYOUT_FORMAT: &str = "quench.sm90.mma-layout.v1";
pub const APPROX_FORMAT: &str = "quench.sm90.approx-error.v1";

/// `isa/sm90/mma_layout.json`
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LayoutTable {
    pub format: String,
    /// Device, driver and date of the measurement.
    pub measured_on: String,
    pub mma: BTreeMap<String, MmaLayout>,
    pub ldmatrix: BTreeMap<String, Vec<LdMatrixEntry>>,
}

/// `isa/sm90/approx.json`
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ApproxTable {
    pub format: String,
    pub measured_on: String,
    pub ops: Vec<ApproxError>,
}

/// What the probes found, with the documentation check beside it.
pub struct ProbeReport {
    pub layout: LayoutTable,
    pub approx: ApproxTable,
    /// Per MMA key: whether the measured layout equals the PTX ISA's figures.
    pub agrees_with_ptx_isa: BTreeMap<String, bool>,
}

/// Copy bytes into a new device buffer.
fn upload(exec: &mut dyn Executor, bytes: &[u8]) -> Result<quench_rt::DevicePtr, IsaError> {
    let p = exec.alloc(bytes.len() as u64)?;
    exec.copy_to_device(p, bytes)?;
    Ok(p)
}

fn run(
    exec: &mut dyn Executor,
    f: &Function,
    grid: u32,
    block: u32,
    args: &[Arg],
) -> Result<(), IsaError> {
    let k = exec.load(f)?;
    let launch = Launch {
        grid: [grid, 1, 1],
        block: [block, 1, 1],
        dynamic_shared_bytes: 0,
    };
    exec.launch(k, &launch, args, StreamId::DEFAULT)?;
    exec.synchronize()?;
    Ok(())
}

fn read_words(
    exec: &mut dyn Executor,
    p: quench_rt::DevicePtr,
    n: usize,
) -> Result<Vec<u32>, IsaError> {
    let mut bytes = vec![0u8; n * 4];
    exec.copy_to_host(p, &mut bytes)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Poisoned output buffer of `n` words (so an unwritten word cannot pass as a result).
fn poisoned(exec: &mut dyn Executor, n: usize) -> Result<quench_rt::DevicePtr, IsaError> {
    upload(exec, &vec![0xA5u8; n * 4])
}

fn acc_values(elem: MmaElem, words: &[u32]) -> Vec<f64> {
    words
        .iter()
        .map(|w| {
            if elem == MmaElem::S8 {
                *w as i32 as f64
            } else {
                f32::from_bits(*w) as f64
            }
        })
        .collect()
}

fn measure_mma(exec: &mut dyn Executor, elem: MmaElem) -> Result<MmaMeasurement, IsaError> {
    let a_n = probe_kernels::slots(elem, FragRole::A);
    let c_n = probe_kernels::slots(elem, FragRole::C);
    let rel = probe_kernels::mma_relation_probe(elem)?;
    let launches = if elem == MmaElem::S8 { 2 } else { 1 };
    let mut relation = vec![];
    for high in 0..launches {
        let n = (a_n * c_n) as usize;
        let out = poisoned(exec, n)?;
        run(exec, &rel, a_n, 32, &[Arg::Ptr(out), Arg::U32(high)])?;
        relation.push(acc_values(elem, &read_words(exec, out, n)?));
        exec.free(out)?;
    }
    let acc = probe_kernels::mma_accumulator_probe(elem)?;
    let out = poisoned(exec, c_n as usize)?;
    run(exec, &acc, 1, 32, &[Arg::Ptr(out)])?;
    let accumulator = acc_values(elem, &read_words(exec, out, c_n as usize)?);
    exec.free(out)?;
    Ok(MmaMeasurement {
        elem,
        relation,
        accumulator,
    })
}

fn measure_approx(
    exec: &mut dyn Executor,
    op: ApproxOp,
    n: usize,
    seed: u64,
) -> Result<ApproxError, IsaError> {
    let (x, y, domain) = approx::inputs(op, n, seed);
    let f32_bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    let px = upload(exec, &f32_bytes(&x))?;
    let py = upload(exec, &f32_bytes(&y))?;
    let po = poisoned(exec, n)?;
    let f = probe_kernels::approx_probe(op)?;
    let grid = (n as u32).div_ceil(256);
    run(
        exec,
        &f,
        grid,
        256,
        &[Arg::Ptr(px), Arg::Ptr(py), Arg::Ptr(po), Arg::U32(n as u32)],
    )?;
    let got: Vec<f32> = read_words(exec, po, n)?
        .into_iter()
        .map(f32::from_bits)
        .collect();
    for p in [px, py, po] {
        exec.free(p)?;
    }
    Ok(approx::measure(op, &x, &y, &got, domain))
}

/// Run all probes. `approx_samples` inputs per approximate instruction.
pub fn run_all(
    exec: &mut dyn Executor,
    measured_on: &str,
    approx_samples: usize,
    seed: u64,
) -> Result<ProbeReport, IsaError> {
    let mut mma = BTreeMap::new();
    let mut agrees = BTreeMap::new();
    for elem in MmaElem::ALL {
        let layout = mma_layout::derive(&measure_mma(exec, elem)?)?;
        agrees.insert(elem.key(), mma_layout::agrees_with_ptx_isa(elem, &layout));
        mma.insert(elem.key(), layout);
    }
    let mut ldmatrix = BTreeMap::new();
    for (num, trans) in LDMATRIX_VARIANTS {
        let f = probe_kernels::ldmatrix_probe(num, trans)?;
        let n = 32 * num as usize;
        let out = poisoned(exec, n)?;
        run(exec, &f, 1, 32, &[Arg::Ptr(out)])?;
        let words = read_words(exec, out, n)?;
        exec.free(out)?;
        ldmatrix.insert(
            probe_kernels::ldmatrix_key(num, trans),
            mma_layout::derive_ldmatrix(num, &words)?,
        );
    }
    let mut ops = vec![];
    for (i, op) in ApproxOp::ALL.into_iter().enumerate() {
        ops.push(measure_approx(exec, op, approx_samples, seed + i as u64)?);
    }
    Ok(ProbeReport {
        layout: LayoutTable {
            format: LAYOUT_FORMAT.into(),
            measured_on: measured_on.into(),
            mma,
            ldmatrix,
        },
        approx: ApproxTable {
            format: APPROX_FORMAT.into(),
            measured_on: measured_on.into(),
            ops,
        },
        agrees_with_ptx_isa: agrees,
    })
}

/// JSON text of a layout table with one `[lane, reg, sub, row, col]` entry per line.
pub fn layout_json(t: &LayoutTable) -> String {
    let entries = |es: &[[u32; 5]], indent: &str| -> String {
        let lines: Vec<String> = es
            .iter()
            .map(|e| format!("{indent}[{}, {}, {}, {}, {}]", e[0], e[1], e[2], e[3], e[4]))
            .collect();
        format!("[\n{}\n{}]", lines.join(",\n"), &indent[..indent.len() - 2])
    };
    let mut mma = vec![];
    for (k, l) in &t.mma {
        let ops: Vec<String> = [("a", &l.a), ("b", &l.b), ("c", &l.c), ("d", &l.d)]
            .iter()
            .map(|(n, es)| format!("      \"{n}\": {}", entries(es, "        ")))
            .collect();
        mma.push(format!("    \"{k}\": {{\n{}\n    }}", ops.join(",\n")));
    }
    let ld: Vec<String> = t
        .ldmatrix
        .iter()
        .map(|(k, es)| format!("    \"{k}\": {}", entries(es, "      ")))
        .collect();
    format!(
        "{{\n  \"format\": {},\n  \"measured_on\": {},\n  \"mma\": {{\n{}\n  }},\n  \"ldmatrix\": {{\n{}\n  }}\n}}\n",
        serde_json::Value::from(t.format.clone()),
        serde_json::Value::from(t.measured_on.clone()),
        mma.join(",\n"),
        ld.join(",\n")
    )
}
