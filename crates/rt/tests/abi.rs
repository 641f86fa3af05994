//! The ABI is derived from the IR, survives JSON, and rejects what it does not know.

mod common;

use quench_ir::{AddrSpace, Block, Builder, Function, Param, Scalar, SharedDecl, Type};
use quench_rt::{AbiParam, KernelAbi, ParamKind, RtError};

fn ptr_f32(name: &str) -> AbiParam {
    AbiParam {
        name: name.into(),
        kind: ParamKind::Ptr {
            space: "global".into(),
            elem: "f32".into(),
        },
        size: 8,
        align: 8,
    }
}

#[test]
fn derived_from_the_ir() {
    let abi = KernelAbi::from_function(&common::saxpy()).expect("abi");
    let want = KernelAbi {
        name: "saxpy".into(),
        params: vec![
            ptr_f32("x"),
            ptr_f32("y"),
            AbiParam {
                name: "a".into(),
                kind: ParamKind::Scalar("f32".into()),
                size: 4,
                align: 4,
            },
            AbiParam {
                name: "n".into(),
                kind: ParamKind::Scalar("u32".into()),
                size: 4,
                align: 4,
            },
        ],
        static_shared_bytes: 0,
        max_threads: common::BLOCK,
        features: vec![],
    };
    assert_eq!(abi, want);
}

#[test]
fn shared_memory_and_features_are_recorded() {
    let mut k = Builder::new("norm", 256);
    let x = k.param("x", Type::Ptr(AddrSpace::Global, Scalar::F32));
    let scale = k.param("scale", Type::Scalar(Scalar::U16));
    let _ = scale;
    let _tile = k.shared_array("tile", Scalar::F32, 100, 16);
    let _acc = k.shared_array("acc", Scalar::F64, 3, 8);
    let i = k.tid_x();
    let p = k.ptr_add(x, i);
    let v = k.load(Type::F32, p);
    let r = k.rsqrt_approx(v);
    k.store(p, r);
    let abi = KernelAbi::from_function(&k.finish().expect("verifies")).expect("abi");
    assert_eq!(abi.static_shared_bytes, 400 + 24);
    assert_eq!(abi.features, vec!["approx".to_string()]);
    assert_eq!(
        abi.params[1],
        AbiParam {
            name: "scale".into(),
            kind: ParamKind::Scalar("u16".into()),
            size: 2,
            align: 2
        }
    );
    assert_eq!(abi.max_threads, 256);
}

#[test]
fn json_round_trip_and_unknown_fields() {
    let abi = KernelAbi::from_function(&common::saxpy()).expect("abi");
    let json = serde_json::to_string(&abi).expect("serialize");
    let back: KernelAbi = serde_json::from_str(&json).expect("deserialize");
    assert_eq!(back, abi);

    let mut v: serde_json::Value = serde_json::from_str(&json).expect("json");
    v["launch_bounds"] = serde_json::json!(1);
    assert!(
        serde_json::from_value::<KernelAbi>(v).is_err(),
        "unknown top-level field"
    );

    let mut v: serde_json::Value = serde_json::from_str(&json).expect("json");
    v["params"][0]["offset"] = serde_json::json!(0);
    assert!(
        serde_json::from_value::<KernelAbi>(v).is_err(),
        "unknown parameter field"
    );

    let mut v: serde_json::Value = serde_json::from_str(&json).expect("json");
    v["params"][0]["kind"]["ptr"]["volatile"] = serde_json::json!(true);
    assert!(
        serde_json::from_value::<KernelAbi>(v).is_err(),
        "unknown pointer field"
    );

    let mut v: serde_json::Value = serde_json::from_str(&json).expect("json");
    v["params"][2]["kind"] = serde_json::json!({ "tensor": "f32" });
    assert!(
        serde_json::from_value::<KernelAbi>(v).is_err(),
        "unknown parameter kind"
    );

    let mut v: serde_json::Value = serde_json::from_str(&json).expect("json");
    v.as_object_mut().expect("object").remove("features");
    assert!(
        serde_json::from_value::<KernelAbi>(v).is_err(),
        "missing field"
    );
}

/// A kernel with only a signature, built directly so that the verifier's own rules
/// do not decide what this test sees.
fn signature(
    name: &str,
    params: &[(&str, Type)],
    shared: &[(Scalar, u32)],
    max_threads: u32,
) -> Function {
    Function {
        name: name.into(),
        params: params
            .iter()
            .map(|(n, t)| Param {
                name: n.to_string(),
                ty: *t,
            })
            .collect(),
        shared: shared
            .iter()
            .enumerate()
            .map(|(i, (elem, len))| SharedDecl {
                name: format!("s{i}"),
                elem: *elem,
                len: *len,
                align: elem.bytes(),
            })
            .collect(),
        max_threads,
        values: vec![],
        body: Block::default(),
    }
}

#[test]
fn unpassable_kernels_are_refused() {
    match KernelAbi::from_function(&signature("flagged", &[("flag", Type::PRED)], &[], 64)) {
        Err(RtError::Abi { kernel, message }) => {
            assert_eq!(kernel, "flagged");
            assert!(
                message.contains("`flag`") && message.contains("pred"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    for ty in [
        Type::Ptr(AddrSpace::Shared, Scalar::F32),
        Type::Vec(Scalar::F32, 4),
        Type::Scalar(Scalar::F16x2),
    ] {
        let f = signature("k", &[("p", ty)], &[], 64);
        assert!(
            matches!(KernelAbi::from_function(&f), Err(RtError::Abi { .. })),
            "{ty}"
        );
    }

    let hoard = signature("hoard", &[], &[(Scalar::F32, 12 * 1024 + 1)], 64);
    match KernelAbi::from_function(&hoard) {
        Err(RtError::Abi { message, .. }) => assert!(message.contains("49156"), "{message}"),
        other => panic!("{other:?}"),
    }
    let fits = signature("fits", &[], &[(Scalar::F32, 12 * 1024)], 64);
    assert_eq!(
        KernelAbi::from_function(&fits)
            .expect("48 KiB fits")
            .static_shared_bytes,
        48 * 1024
    );

    for bound in [0, 1025] {
        let f = signature("bound", &[], &[], bound);
        assert!(
            matches!(KernelAbi::from_function(&f), Err(RtError::Abi { .. })),
            "max_threads {bound}"
        );
    }
}
