//! Device-to-device copies on the SMs. Hopper's copy engine moves about 190 GB/s between
//! two places in GPU memory (measured on an H100), a copy kernel over 2 TB/s; so a copy
//! whose ends and length are 16-byte aligned runs as a kernel, the rest on the copy engine.

use quench_ir::{AddrSpace, Builder, Function, Scalar, Type};

/// Bytes each thread moves: one 16-byte load and store.
pub const GRAIN: u64 = 16;
/// Threads per block.
pub const THREADS: u32 = 256;
/// The most 16-byte grains one launch moves (16 GiB): indices stay in 32 bits.
pub const MAX_GRAINS: u64 = 1 << 30;

/// `y[i] = x[i]` for `i < n`, 16 bytes at a time, a thread a grain.
pub fn copy_grains() -> Function {
    let mut k = Builder::new("copy_grains_u32x4", THREADS);
    let x = k.param("x", Type::Ptr(AddrSpace::Global, Scalar::U32));
    let y = k.param("y", Type::Ptr(AddrSpace::Global, Scalar::U32));
    let n = k.param("n", Type::U32);
    let block = k.ctaid_x();
    let first = k.mul_const(block, THREADS);
    let tid = k.tid_x();
    let i = k.add(first, tid);
    let inside = k.lt(i, n);
    k.if_then(inside, |k| {
        let words = k.mul_const(i, 4);
        let from = k.ptr_add(x, words);
        let v = k.load(Type::Vec(Scalar::U32, 4), from);
        let to = k.ptr_add(y, words);
        k.store(to, v);
    });
    k.finish().expect("the copy kernel builds")
}

/// Whether a copy of `bytes` from `src` to `dst` can run as [`copy_grains`].
pub fn fits(dst: u64, src: u64, bytes: u64) -> bool {
    (dst | src | bytes).is_multiple_of(GRAIN)
}

/// The launches a copy of `bytes` takes: (byte offset, grains) of each.
pub fn pieces(bytes: u64) -> impl Iterator<Item = (u64, u32)> {
    let grains = bytes / GRAIN;
    (0..grains.div_ceil(MAX_GRAINS)).map(move |p| {
        let first = p * MAX_GRAINS;
        (first * GRAIN, (grains - first).min(MAX_GRAINS) as u32)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_copies_every_grain_and_nothing_past_n() {
        use crate::{Arg, Executor, InterpExecutor, Launch, StreamId};
        // 1,000 grains (not a whole number of blocks) and a poisoned grain past them, on
        // the interpreter.
        let n = 1000u32;
        let bytes = (n as usize + 1) * GRAIN as usize;
        let x: Vec<u8> = (0..bytes)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 9) as u8)
            .collect();
        let mut ex = InterpExecutor::new();
        let (src, dst) = (
            ex.alloc(bytes as u64).unwrap(),
            ex.alloc(bytes as u64).unwrap(),
        );
        ex.copy_to_device(src, &x).unwrap();
        ex.copy_to_device(dst, &vec![0xa5; bytes]).unwrap();
        let k = ex.load(&copy_grains()).unwrap();
        let launch = Launch::linear(n.div_ceil(THREADS), THREADS);
        ex.launch(
            k,
            &launch,
            &[Arg::Ptr(src), Arg::Ptr(dst), Arg::U32(n)],
            StreamId::DEFAULT,
        )
        .unwrap();
        let mut y = vec![0; bytes];
        ex.copy_to_host(dst, &mut y).unwrap();
        let copied = n as usize * GRAIN as usize;
        assert!(y[..copied] == x[..copied], "the grains differ");
        assert!(
            y[copied..].iter().all(|&b| b == 0xa5),
            "a grain past n was written"
        );
    }

    /// Both code generators compile it: quench's own (which the native backend runs with
    /// `--codegen sass`) and ptxas, without spilling.
    #[test]
    fn the_kernel_compiles_with_both_code_generators() {
        let f = copy_grains();
        crate::codegen::own_cubin(&f).expect("quench's own code");
        let Some(_) = quench_testkit::ok(quench_ptx::ptxas::find_ptxas()) else {
            return;
        };
        let ptx = quench_ptx::emit(&f).unwrap();
        let report = quench_ptx::ptxas::assemble(&ptx, "sm_90").unwrap();
        assert_eq!(report.kernel, "copy_grains_u32x4");
        assert_eq!(report.spill_store_bytes + report.spill_load_bytes, 0);
    }

    #[test]
    fn alignment_and_pieces() {
        assert!(fits(0x1000, 0x2000, 4096));
        assert!(!fits(0x1004, 0x2000, 4096));
        assert!(!fits(0x1000, 0x2000, 4100));
        let p: Vec<_> = pieces(GRAIN * (2 * MAX_GRAINS + 3)).collect();
        assert_eq!(
            p,
            vec![
                (0, MAX_GRAINS as u32),
                (GRAIN * MAX_GRAINS, MAX_GRAINS as u32),
                (2 * GRAIN * MAX_GRAINS, 3)
            ]
        );
        assert_eq!(pieces(0).count(), 0);
    }
}
