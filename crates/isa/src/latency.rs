//! Latency and throughput probes: one kernel per instruction class and chain length, a
//! chain of dependent links (`x = op(x)`) between two reads of `%clock64`.
//!
//! **Latency**: one warp, one chain. **Throughput**: one block of [`THROUGHPUT_THREADS`]
//! threads (all four schedulers of one SM busy), [`STREAMS`] independent chains a thread.
//! Each probe is built at [`SHORT`] and [`LONG`] links; the difference of the two cycle
//! counts, divided by the difference in links (or in instructions of the class's opcode,
//! counted in the machine code the driver made), cancels the clock reads, the set-up and
//! the chain's tail. The operands come from parameters, so no link can be folded at
//! compile time; what the compiler made of a link is read back from its code (see
//! [`LatencyRow::per_link`]).

use std::collections::BTreeMap;

use quench_ir::{
    AddrSpace, Builder, FragRole, Function, MmaShape, Scalar, Special, Type, Value, VerifyError,
};
use serde::{Deserialize, Serialize};

pub const FORMAT: &str = "quench.sm90.latencies.v1";
/// Links of the short and the long chain.
pub const SHORT: u32 = 128;
pub const LONG: u32 = 384;
/// Independent chains a thread in the throughput probes.
pub const STREAMS: u32 = 8;
pub const THROUGHPUT_THREADS: u32 = 1024;
/// Elements of the pointer-chase buffers (one per thread of the throughput probe).
pub const CHASE_LEN: u32 = THROUGHPUT_THREADS;

/// An instruction class and the link that exercises it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// `x = fma(x, a, b)`, f32.
    Ffma,
    /// `x = x + a`, f32.
    Fadd,
    /// `x = x · a`, f32.
    Fmul,
    /// `x = x · a + b`, u32.
    Imad,
    /// `x = (x + a) ^ b`, u32: an add and a logic operation a link (a chain of adds alone
    /// is folded into one multiply-add by the compiler).
    Iadd,
    /// `x = rsqrt.approx(x)`.
    MufuRsq,
    /// `x = f32(f16(x))`.
    Cvt,
    /// `x = x < a ? b : a`, u32 (a comparison into a predicate, then a select).
    Setp,
    /// `x = shfl.bfly(x, 1)`.
    Shfl,
    /// `c = mma.m16n8k16(a, b, c)`, f16 operands, f32 accumulators.
    Hmma,
    /// `p = shared[p]` (a pointer chase in shared memory).
    Lds,
    /// `p = global[p]` (a pointer chase in global memory that stays in L1).
    Ldg,
}

impl Class {
    pub const ALL: [Class; 12] = [
        Class::Ffma,
        Class::Fadd,
        Class::Fmul,
        Class::Imad,
        Class::Iadd,
        Class::MufuRsq,
        Class::Cvt,
        Class::Setp,
        Class::Shfl,
        Class::Hmma,
        Class::Lds,
        Class::Ldg,
    ];

    pub fn key(self) -> &'static str {
        match self {
            Class::Ffma => "ffma",
            Class::Fadd => "fadd",
            Class::Fmul => "fmul",
            Class::Imad => "imad",
            Class::Iadd => "iadd_xor",
            Class::MufuRsq => "mufu_rsq",
            Class::Cvt => "cvt_f32_f16_f32",
            Class::Setp => "setp_select",
            Class::Shfl => "shfl_bfly",
            Class::Hmma => "hmma_m16n8k16_f16_f32",
            Class::Lds => "lds_chase",
            Class::Ldg => "ldg_chase_l1",
        }
    }

    /// The SASS mnemonic (up to its first `.`) whose count measures the chain.
    pub fn opcode(self) -> &'static str {
        match self {
            Class::Ffma => "FFMA",
            Class::Fadd => "FADD",
            Class::Fmul => "FMUL",
            Class::Imad => "IMAD",
            Class::Iadd => "VIADD",
            Class::MufuRsq => "MUFU",
            Class::Cvt => "F2FP",
            Class::Setp => "ISETP",
            Class::Shfl => "SHFL",
            Class::Hmma => "HMMA",
            Class::Lds => "LDS",
            Class::Ldg => "LDG",
        }
    }
}

/// Which of the two probes of a class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Latency,
    Throughput,
}

impl Mode {
    pub fn threads(self) -> u32 {
        match self {
            Mode::Latency => 32,
            Mode::Throughput => THROUGHPUT_THREADS,
        }
    }

    pub fn streams(self) -> u32 {
        match self {
            Mode::Latency => 1,
            Mode::Throughput => STREAMS,
        }
    }

    fn key(self) -> &'static str {
        match self {
            Mode::Latency => "lat",
            Mode::Throughput => "tput",
        }
    }
}

/// The parameters every probe takes: `cycles` (u64, thread 0 writes the chain's cycles
/// to element 0), `values` (u32, each thread's final chain values, `threads · streams`
/// of them, so that nothing is dead), `a`, `b` (u32 operands: f32 bits for the float
/// classes) and `chase` ([`CHASE_LEN`] u32, element `i` holding `i`).
pub fn probe(class: Class, mode: Mode, links: u32) -> Result<Function, VerifyError> {
    let name = format!("probe_{}_{}_{links}", mode.key(), class.key());
    let mut k = Builder::new(&name, mode.threads());
    let cycles = k.param("cycles", Type::Ptr(AddrSpace::Global, Scalar::U64));
    let values = k.param("values", Type::Ptr(AddrSpace::Global, Scalar::U32));
    let a = k.param("a", Type::U32);
    let b = k.param("b", Type::U32);
    let chase = k.param("chase", Type::Ptr(AddrSpace::Global, Scalar::U32));
    let tid = k.tid_x();
    let ops = Operands::emit(&mut k, class, a, b, tid);
    let mut state: Vec<Value> = (0..mode.streams()).map(|s| ops.init(&mut k, s)).collect();
    k.barrier();
    let t0 = k.special(Special::Clock64);
    for _ in 0..links {
        for x in state.iter_mut() {
            *x = ops.link(&mut k, *x, chase);
        }
    }
    k.barrier();
    let t1 = k.special(Special::Clock64);
    let zero = k.const_u32(0);
    let first = k.eq(tid, zero);
    k.if_then(first, |k| {
        let dt = k.sub(t1, t0);
        k.store(cycles, dt);
    });
    let base = k.mul_const(tid, mode.streams());
    for (s, x) in state.into_iter().enumerate() {
        let bits = ops.bits(&mut k, x);
        let i = k.add_const(base, s as u32);
        let p = k.ptr_add(values, i);
        k.store(p, bits);
    }
    k.finish()
}

/// A class's operands, built once before the clock starts.
struct Operands {
    class: Class,
    a: Value,
    b: Value,
    tid: Value,
    shared: Option<Value>,
    /// The MMA's A and B fragments.
    frags: Option<(Value, Value)>,
}

impl Operands {
    fn emit(k: &mut Builder, class: Class, a: Value, b: Value, tid: Value) -> Operands {
        let float = matches!(
            class,
            Class::Ffma | Class::Fadd | Class::Fmul | Class::MufuRsq | Class::Cvt
        );
        let (a, b) = if float {
            (
                k.bitcast(Type::Scalar(Scalar::F32), a),
                k.bitcast(Type::Scalar(Scalar::F32), b),
            )
        } else {
            (a, b)
        };
        let shared = (class == Class::Lds).then(|| {
            let s = k.shared_array("chase", Scalar::U32, CHASE_LEN, 16);
            let p = k.ptr_add(s, tid);
            k.store(p, tid);
            s
        });
        let frags = (class == Class::Hmma).then(|| {
            let h = k.const_bits(Type::Scalar(Scalar::F16x2), 0x3c00_3c00);
            let frag = |k: &mut Builder, role: FragRole, regs: usize| {
                k.pack(
                    Builder::frag_type(MmaShape::M16N8K16, role, Scalar::F16),
                    &vec![h; regs],
                )
            };
            (frag(k, FragRole::A, 4), frag(k, FragRole::B, 2))
        });
        Operands {
            class,
            a,
            b,
            tid,
            shared,
            frags,
        }
    }

    /// Stream `s`'s first value.
    fn init(&self, k: &mut Builder, s: u32) -> Value {
        let seed = k.add_const(self.tid, s);
        match self.class {
            Class::Ffma | Class::Fadd | Class::Fmul | Class::MufuRsq => {
                let f = k.cvt(Scalar::F32, seed);
                k.add(f, self.a)
            }
            Class::Cvt => k.cvt(Scalar::F32, seed),
            Class::Imad | Class::Iadd | Class::Setp | Class::Shfl => k.xor(seed, self.b),
            // Streams start at distinct elements, so that their loads are distinct too.
            Class::Lds | Class::Ldg => {
                let p = k.add_const(self.tid, s * (CHASE_LEN / STREAMS));
                k.and_const(p, CHASE_LEN - 1)
            }
            Class::Hmma => {
                let c = k.cvt(Scalar::F32, seed);
                k.pack(
                    Builder::frag_type(MmaShape::M16N8K16, FragRole::C, Scalar::F32),
                    &[c; 4],
                )
            }
        }
    }

    fn link(&self, k: &mut Builder, x: Value, chase: Value) -> Value {
        match self.class {
            Class::Ffma => k.fma(x, self.a, self.b),
            Class::Fadd => k.add(x, self.a),
            Class::Fmul => k.mul(x, self.a),
            Class::Imad => {
                let m = k.mul(x, self.a);
                k.add(m, self.b)
            }
            Class::Iadd => {
                let y = k.add(x, self.a);
                k.xor(y, self.b)
            }
            Class::MufuRsq => k.rsqrt_approx(x),
            Class::Cvt => {
                let h = k.cvt(Scalar::F16, x);
                k.cvt(Scalar::F32, h)
            }
            Class::Setp => {
                let lt = k.lt(x, self.a);
                k.select(lt, self.b, self.a)
            }
            Class::Shfl => k.shfl_bfly(x, 1),
            Class::Hmma => {
                let (a, b) = self.frags.expect("the MMA's fragments");
                k.mma(MmaShape::M16N8K16, a, b, x)
            }
            Class::Lds => {
                let s = self.shared.expect("the shared chase array");
                let p = k.ptr_add(s, x);
                k.load(Type::U32, p)
            }
            Class::Ldg => {
                let p = k.ptr_add(chase, x);
                k.load(Type::U32, p)
            }
        }
    }

    /// 32 bits of a final value.
    fn bits(&self, k: &mut Builder, x: Value) -> Value {
        match self.class {
            Class::Ffma | Class::Fadd | Class::Fmul | Class::MufuRsq | Class::Cvt => {
                k.bitcast(Type::U32, x)
            }
            Class::Hmma => {
                let e = k.extract(x, 0);
                k.bitcast(Type::U32, e)
            }
            _ => x,
        }
    }
}

/// The operands `a` and `b` a class is launched with (f32 bits for the float classes):
/// values that keep every chain finite and unfoldable.
pub fn operands(class: Class) -> (u32, u32) {
    match class {
        Class::Ffma => (0.999_f32.to_bits(), 0.001_f32.to_bits()),
        Class::Fadd => (1e-3_f32.to_bits(), 0),
        Class::Fmul => (0.999_f32.to_bits(), 0),
        Class::MufuRsq | Class::Cvt => (1.0_f32.to_bits(), 0),
        Class::Imad => (0x9e37_79b9, 0x7f4a_7c15),
        Class::Iadd => (0x9e37_79b9, 0x7f4a_7c15),
        Class::Setp => (1 << 20, 7),
        Class::Shfl => (0, 0x5bd1_e995),
        Class::Hmma | Class::Lds | Class::Ldg => (0, 0),
    }
}

/// One timed probe pair: median cycles of each chain length, and the instructions of its
/// code by mnemonic (up to the first `.`).
#[derive(Clone, Debug, Default)]
pub struct Timed {
    pub short_cycles: f64,
    pub long_cycles: f64,
    pub short_code: BTreeMap<String, usize>,
    pub long_code: BTreeMap<String, usize>,
}

/// A row of `isa/sm90/latencies.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LatencyRow {
    pub class: String,
    pub opcode: String,
    /// Cycles a link of one chain takes (latency), or thread-level links an SM completes
    /// per cycle (throughput).
    pub latency_cycles_per_link: f64,
    pub throughput_links_per_cycle_per_sm: f64,
    /// Cycles per instruction of `opcode` in the dependent chain, and thread-level
    /// instructions of `opcode` per cycle per SM with independent streams.
    pub latency_cycles: Option<f64>,
    pub throughput_per_cycle_per_sm: Option<f64>,
    /// What one link compiled to: instructions per link by mnemonic (latency probe).
    pub per_link: BTreeMap<String, f64>,
}

fn per_link(t: &Timed, links: f64) -> BTreeMap<String, f64> {
    t.long_code
        .iter()
        .filter_map(|(op, &n)| {
            let d = n as f64 - *t.short_code.get(op).unwrap_or(&0) as f64;
            (d > 0.0).then(|| (op.clone(), d / links))
        })
        .collect()
}

/// The row of `class` from its latency and throughput probe pairs.
pub fn row(class: Class, latency: &Timed, throughput: &Timed) -> LatencyRow {
    let links = f64::from(LONG - SHORT);
    let dl = latency.long_cycles - latency.short_cycles;
    let dt = throughput.long_cycles - throughput.short_cycles;
    let op_count = |t: &Timed| {
        let n = |c: &BTreeMap<String, usize>| *c.get(class.opcode()).unwrap_or(&0) as f64;
        n(&t.long_code) - n(&t.short_code)
    };
    let lat_ops = op_count(latency);
    let tput_ops = op_count(throughput);
    let warps = f64::from(Mode::Throughput.threads() / 32);
    LatencyRow {
        class: class.key().into(),
        opcode: class.opcode().into(),
        latency_cycles_per_link: dl / links,
        throughput_links_per_cycle_per_sm: f64::from(Mode::Throughput.threads())
            * f64::from(STREAMS)
            * links
            / dt,
        latency_cycles: (lat_ops > 0.0).then(|| dl / lat_ops),
        throughput_per_cycle_per_sm: (tput_ops > 0.0).then(|| tput_ops * warps * 32.0 / dt),
        per_link: per_link(latency, links),
    }
}

/// `isa/sm90/latencies.json`
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LatencyTable {
    pub format: String,
    pub measured_on: String,
    pub method: String,
    pub rows: Vec<LatencyRow>,
}

/// Launches per probe; the median of their cycle counts is kept.
pub const LAUNCHES: usize = 7;

/// How the table was measured, for its `method` field.
pub fn method() -> String {
    format!(
        "cycles of %clock64 around chains of {SHORT} and {LONG} links, the difference over {} links; \
         median of {LAUNCHES} launches each; latency: one warp, one chain; throughput: one block of \
         {THROUGHPUT_THREADS} threads, {STREAMS} independent chains a thread; instruction counts read \
         from the driver's cubin by quench's disassembler",
        LONG - SHORT
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(n: usize, other: usize) -> BTreeMap<String, usize> {
        BTreeMap::from([("FFMA".to_string(), n), ("S2UR".to_string(), other)])
    }

    #[test]
    fn rows_take_the_difference_of_the_two_chains() {
        let links = (LONG - SHORT) as usize;
        // 4 cycles a link, one FFMA a link, 100 cycles of set-up either way.
        let lat = Timed {
            short_cycles: 100.0 + 4.0 * SHORT as f64,
            long_cycles: 100.0 + 4.0 * LONG as f64,
            short_code: code(SHORT as usize + 3, 2),
            long_code: code(LONG as usize + 3, 2),
        };
        // 128 thread-level FFMAs a cycle.
        let per = (THROUGHPUT_THREADS * STREAMS) as f64;
        let tput = Timed {
            short_cycles: 50.0 + per * SHORT as f64 / 128.0,
            long_cycles: 50.0 + per * LONG as f64 / 128.0,
            short_code: code(STREAMS as usize * SHORT as usize, 2),
            long_code: code(STREAMS as usize * LONG as usize, 2),
        };
        let r = row(Class::Ffma, &lat, &tput);
        assert_eq!(r.latency_cycles_per_link, 4.0);
        assert_eq!(r.latency_cycles, Some(4.0));
        assert_eq!(r.throughput_links_per_cycle_per_sm, 128.0);
        assert_eq!(r.throughput_per_cycle_per_sm, Some(128.0));
        assert_eq!(r.per_link, BTreeMap::from([("FFMA".to_string(), 1.0)]));
        assert_eq!(links, 256);
        // A chain the compiler folded away has no instructions to divide by.
        let folded = Timed {
            long_code: code(3, 2),
            short_code: code(3, 2),
            ..lat
        };
        assert_eq!(row(Class::Ffma, &folded, &tput).latency_cycles, None);
    }

    #[test]
    fn every_probe_verifies() {
        for class in Class::ALL {
            for mode in [Mode::Latency, Mode::Throughput] {
                probe(class, mode, SHORT).unwrap_or_else(|e| panic!("{class:?} {mode:?}: {e}"));
            }
        }
    }
}
