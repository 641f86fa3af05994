//! The access analysis on hand-built kernels and on library kernels whose addressing is
//! known: weights walked directly, tables and KV caches reached through loaded indices.

use quench_ir::{AddrSpace, Builder, Scalar, Type};
use quench_prof::access::{param_access, Access, ParamAccess};

fn ptr(s: Scalar) -> Type {
    Type::Ptr(AddrSpace::Global, s)
}

fn of(name: &str) -> Vec<(String, ParamAccess)> {
    let spec = quench_kernels::find(name).unwrap_or_else(|e| panic!("{e}"));
    let p = spec
        .parse_params(spec.small_params())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let f = spec.build(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
    f.params
        .iter()
        .map(|p| p.name.clone())
        .zip(param_access(&f))
        .collect()
}

fn get(acc: &[(String, ParamAccess)], param: &str) -> (Access, Access) {
    let a = acc
        .iter()
        .find(|(n, _)| n == param)
        .unwrap_or_else(|| panic!("no parameter {param}: {acc:?}"))
        .1;
    (a.read, a.write)
}

#[test]
fn gather_through_a_loop_carried_index_is_indirect() {
    // out[i] = table[idx[i]] and, in a loop, out[i] += table[j] for j < n: the first read
    // of `table` is a gather, the loop's is direct.
    let mut k = Builder::new("gather", 32);
    let idx = k.param("idx", ptr(Scalar::U32));
    let table = k.param("table", ptr(Scalar::F32));
    let out = k.param("out", ptr(Scalar::F32));
    let n = k.param("n", Type::U32);
    // A pointer the kernel never uses.
    let _other = k.param("other", ptr(Scalar::F32));
    let i = k.tid_x();
    let at = k.ptr_add(idx, i);
    let j = k.load(Type::U32, at);
    let row = k.ptr_add(table, j);
    let x = k.load(Type::F32, row);
    let (zero, one) = (k.const_u32(0), k.const_u32(1));
    let sum = k.for_range(zero, n, one, &[x], |k, iv, acc| {
        let at = k.ptr_add(table, iv);
        let y = k.load(Type::F32, at);
        vec![k.add(acc[0], y)]
    });
    let dst = k.ptr_add(out, i);
    k.store(dst, sum[0]);
    let f = k.finish().expect("verifies");
    let acc = param_access(&f);
    use Access::*;
    let got: Vec<(Access, Access)> = acc.iter().map(|a| (a.read, a.write)).collect();
    assert_eq!(
        got,
        [
            (Direct, None),
            (Direct, None),
            (None, Direct),
            (None, None),
            (None, None)
        ]
    );

    // Without the loop, the only read of `table` is the gather.
    let mut k = Builder::new("gather_only", 32);
    let idx = k.param("idx", ptr(Scalar::U32));
    let table = k.param("table", ptr(Scalar::F32));
    let out = k.param("out", ptr(Scalar::F32));
    let i = k.tid_x();
    let at = k.ptr_add(idx, i);
    let j = k.load(Type::U32, at);
    // The index passes through arithmetic and a loop-carried value first.
    let (zero, one, two) = (k.const_u32(0), k.const_u32(1), k.const_u32(2));
    let shifted = k.for_range(zero, two, one, &[j], |k, _, c| vec![k.add_const(c[0], 1)]);
    let back = k.sub(shifted[0], two);
    let row = k.ptr_add(table, back);
    let x = k.load(Type::F32, row);
    let dst = k.ptr_add(out, j);
    k.store(dst, x);
    let f = k.finish().expect("verifies");
    let got: Vec<(Access, Access)> = param_access(&f).iter().map(|a| (a.read, a.write)).collect();
    assert_eq!(got, [(Direct, None), (Indirect, None), (None, Indirect)]);
}

#[test]
fn library_kernels_walk_weights_and_gather_tables_and_caches() {
    use Access::*;
    let g = of("qgemv_q4_1_xf32");
    assert_eq!(
        [get(&g, "w"), get(&g, "x"), get(&g, "y")],
        [(Direct, None), (Direct, None), (None, Direct)]
    );
    let e = of("embed_q4_1");
    assert_eq!(
        [get(&e, "ids"), get(&e, "table"), get(&e, "out")],
        [(Direct, None), (Indirect, None), (None, Direct)]
    );
    let a = of("attention_decode_f16");
    assert_eq!(
        [get(&a, "q"), get(&a, "k_cache"), get(&a, "v_cache")],
        [(Direct, None), (Indirect, None), (Indirect, None)]
    );
    assert_eq!(get(&a, "part_o"), (None, Direct));
    let kv = of("kv_append_f16");
    assert_eq!(
        [get(&kv, "k"), get(&kv, "k_cache"), get(&kv, "v_cache")],
        [(Direct, None), (None, Indirect), (None, Indirect)]
    );
    let n = of("rmsnorm_residual_f32");
    assert_eq!(
        [get(&n, "residual"), get(&n, "eps")],
        [(Direct, Direct), (None, None)]
    );
}
