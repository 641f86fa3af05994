//! `quench isa latency`: time the latency and throughput probes ([`quench_isa::latency`])
//! on the GPU, count what each link compiled to in the driver's own cubin (read with
//! quench's disassembler), and write `isa/sm90/latencies.json` with a receipt.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use quench_isa::latency::{self, Class, LatencyTable, Mode, Timed, CHASE_LEN, LONG, SHORT};
use quench_rt::{Arg, CudaExecutor, DevicePtr, Executor, Launch, StreamId};
use quench_sass::cubin::Cubin;
use quench_sass::table::Tables;
use serde_json::json;

use crate::receipt;

#[derive(clap::Args)]
pub struct LatencyArgs {
    /// Folder for the table (latencies.json).
    #[arg(long, default_value = "isa/sm90")]
    pub out: PathBuf,
    /// Where to write the receipt.
    #[arg(long, default_value = "receipts/isa-latency.json")]
    pub receipt: PathBuf,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    pub gpu: u32,
}

type Cubins = Arc<Mutex<BTreeMap<String, Vec<u8>>>>;

/// Instructions of each kernel's code by mnemonic (up to its first `.`; `.inst` for those
/// the tables do not decode), predicates and offsets left out.
fn mnemonics(tables: &Tables, cubin: &[u8]) -> Result<BTreeMap<String, usize>, String> {
    let c = Cubin::parse(cubin).map_err(|e| e.to_string())?;
    let (text, _) = quench_sass::dis::disassemble(&c, tables).map_err(|e| e.to_string())?;
    let mut count = BTreeMap::new();
    for line in text.lines() {
        // `/*0040*/  @P0 FFMA R1, ... ;  /* control */`
        let Some(rest) = line.trim_start().strip_prefix("/*") else {
            continue;
        };
        let Some((_, inst)) = rest.split_once("*/") else {
            continue;
        };
        let mut words = inst.split_whitespace();
        let Some(mut op) = words.next() else { continue };
        if op.starts_with('@') {
            let Some(next) = words.next() else { continue };
            op = next;
        }
        // An instruction the tables do not decode is printed as `.inst 0x…`.
        let op = match op.strip_prefix('.') {
            Some(_) => ".inst",
            None => op.split('.').next().unwrap_or(op).trim_end_matches(';'),
        };
        *count.entry(op.to_string()).or_insert(0) += 1;
    }
    Ok(count)
}

struct Bench<'a> {
    exec: CudaExecutor,
    cubins: Cubins,
    tables: &'a Tables,
    cycles: DevicePtr,
    values: DevicePtr,
    chase: DevicePtr,
}

impl Bench<'_> {
    /// Median cycles of `f` over [`latency::LAUNCHES`] launches, and its code.
    fn time(
        &mut self,
        class: Class,
        mode: Mode,
        links: u32,
    ) -> Result<(f64, BTreeMap<String, usize>), String> {
        let e = |x: quench_rt::RtError| x.to_string();
        let f = latency::probe(class, mode, links).map_err(|x| x.to_string())?;
        let k = self.exec.load(&f).map_err(e)?;
        let code = {
            let cubins = self.cubins.lock().unwrap_or_else(PoisonError::into_inner);
            let cubin = cubins
                .get(&f.name)
                .ok_or_else(|| format!("{}: its cubin was not seen", f.name))?;
            mnemonics(self.tables, cubin).map_err(|x| format!("{}: {x}", f.name))?
        };
        let (a, b) = latency::operands(class);
        let launch = Launch {
            grid: [1, 1, 1],
            block: [mode.threads(), 1, 1],
            dynamic_shared_bytes: 0,
        };
        let args = [
            Arg::Ptr(self.cycles),
            Arg::Ptr(self.values),
            Arg::U32(a),
            Arg::U32(b),
            Arg::Ptr(self.chase),
        ];
        let mut samples = vec![];
        // One launch to warm up, then the timed ones.
        for i in 0..=latency::LAUNCHES {
            self.exec
                .copy_to_device(self.cycles, &[0u8; 8])
                .map_err(e)?;
            self.exec
                .launch(k, &launch, &args, StreamId::DEFAULT)
                .map_err(e)?;
            self.exec.synchronize().map_err(e)?;
            let mut out = [0u8; 8];
            self.exec.copy_to_host(self.cycles, &mut out).map_err(e)?;
            let c = u64::from_le_bytes(out);
            if c == 0 {
                return Err(format!("{}: no cycles written", f.name));
            }
            if i > 0 {
                samples.push(c as f64);
            }
        }
        samples.sort_by(f64::total_cmp);
        Ok((samples[samples.len() / 2], code))
    }

    fn pair(&mut self, class: Class, mode: Mode) -> Result<Timed, String> {
        let (short_cycles, short_code) = self.time(class, mode, SHORT)?;
        let (long_cycles, long_code) = self.time(class, mode, LONG)?;
        Ok(Timed {
            short_cycles,
            long_cycles,
            short_code,
            long_code,
        })
    }
}

pub fn run(a: &LatencyArgs) -> Result<(), String> {
    let tables = Tables::sm90()?;
    let device = crate::gpu::describe(a.gpu)?;
    let e = |x: quench_rt::RtError| x.to_string();
    let mut exec = CudaExecutor::new(a.gpu).map_err(e)?;
    let cubins: Cubins = Arc::default();
    let keep = Arc::clone(&cubins);
    exec.set_cubin_rewrite(Box::new(move |name, cubin| {
        keep.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_string(), cubin.to_vec());
        Ok(cubin.to_vec())
    }));
    let values_len = u64::from(latency::THROUGHPUT_THREADS * latency::STREAMS) * 4;
    let cycles = exec.alloc(8).map_err(e)?;
    let values = exec.alloc(values_len).map_err(e)?;
    let chase = exec.alloc(u64::from(CHASE_LEN) * 4).map_err(e)?;
    let identity: Vec<u8> = (0..CHASE_LEN).flat_map(u32::to_le_bytes).collect();
    exec.copy_to_device(chase, &identity).map_err(e)?;
    let mut bench = Bench {
        exec,
        cubins,
        tables,
        cycles,
        values,
        chase,
    };
    let mut rows = vec![];
    for class in Class::ALL {
        eprintln!("timing {} ...", class.key());
        let lat = bench.pair(class, Mode::Latency)?;
        let tput = bench.pair(class, Mode::Throughput)?;
        rows.push(latency::row(class, &lat, &tput));
    }
    let measured_on = crate::cmd_isa::measured_on(&device);
    let table = LatencyTable {
        format: latency::FORMAT.into(),
        measured_on,
        method: latency::method(),
        rows,
    };
    println!(
        "{:<24} {:<6} {:>10} {:>10} {:>12} {:>12}  per link",
        "class", "opcode", "lat/link", "lat/inst", "tput/link", "tput/inst"
    );
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.2}"));
    for r in &table.rows {
        let mix: Vec<String> = r
            .per_link
            .iter()
            .map(|(k, v)| format!("{k}×{v:.2}"))
            .collect();
        println!(
            "{:<24} {:<6} {:>10.2} {:>10} {:>12.2} {:>12}  {}",
            r.class,
            r.opcode,
            r.latency_cycles_per_link,
            opt(r.latency_cycles),
            r.throughput_links_per_cycle_per_sm,
            opt(r.throughput_per_cycle_per_sm),
            mix.join(" ")
        );
    }
    let value = serde_json::to_value(&table).map_err(|x| x.to_string())?;
    std::fs::create_dir_all(&a.out)
        .map_err(|x| format!("cannot create {}: {x}", a.out.display()))?;
    receipt::write_json(&a.out.join("latencies.json"), &value)?;
    let rec = receipt::receipt(
        "isa-latency",
        device,
        json!({ "short_links": SHORT, "long_links": LONG, "launches": latency::LAUNCHES }),
        json!("every probe wrote its cycle count; each class's opcode counted in its own code"),
        json!({ "passed": true, "table": value }),
    );
    receipt::write_json(&a.receipt, &rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each probe through quench's PTX and ptxas (the compiler the driver's JIT is): the
    /// long chain holds the class's opcode a whole number of times more per link and
    /// stream than the short one (no link folded away; in the throughput probe two
    /// streams may share one), counted by the same disassembly `quench isa latency` reads.
    #[test]
    fn every_chain_compiles_to_its_opcode_link_by_link() {
        let Some(_) = quench_testkit::ok(quench_ptx::ptxas::find_ptxas()) else {
            return;
        };
        let tables = Tables::sm90().expect("the tables");
        let mut wrong = vec![];
        for class in Class::ALL {
            for mode in [Mode::Latency, Mode::Throughput] {
                let count = |links| {
                    let f = latency::probe(class, mode, links).expect("a probe");
                    let ptx = quench_ptx::emit(&f).expect("PTX");
                    let cubin = quench_ptx::ptxas::assemble(&ptx, "sm_90")
                        .unwrap_or_else(|e| panic!("{}: {e}", f.name))
                        .cubin;
                    let code = mnemonics(tables, &cubin).expect("disassembles");
                    *code.get(class.opcode()).unwrap_or(&0)
                };
                let extra = count(LONG) as f64 - count(SHORT) as f64;
                let per_link = extra / f64::from((LONG - SHORT) * mode.streams());
                // Independent streams may share an instruction (two f16 conversions
                // packed in one F2FP); one chain may not.
                let whole = per_link >= 1.0 && per_link.fract() == 0.0;
                let ok = match mode {
                    Mode::Latency => whole,
                    Mode::Throughput => whole || per_link == 0.5,
                };
                if !ok {
                    wrong.push(format!(
                        "{class:?} {mode:?}: {extra} more {} ({per_link} a link)",
                        class.opcode()
                    ));
                }
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }
}
