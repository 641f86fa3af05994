//! Reading ptxas's cubins and writing them back byte for byte; a cubin written from a
//! kernel description; malformed input is an error, never a panic.

mod common;

use quench_sass::build::{build, KernelDesc};
use quench_sass::cubin::Cubin;

#[test]
fn every_library_cubin_writes_back_byte_for_byte() {
    let Some(lib) = common::library() else { return };
    for a in lib {
        let c = Cubin::parse(&a.cubin).unwrap_or_else(|e| panic!("{}: {e}", a.name));
        assert_eq!(c.kernels.len(), 1, "{}", a.name);
        let k = &c.kernels[0];
        assert_eq!(k.name, a.name);
        assert!(k.registers.is_some_and(|r| r > 0), "{}: registers", a.name);
        assert!(!k.params.is_empty(), "{}: params", a.name);
        let out = c.write().unwrap_or_else(|e| panic!("{}: {e}", a.name));
        assert!(out == a.cubin, "{}: written cubin differs", a.name);
    }
    eprintln!("{} cubins round-trip byte for byte", lib.len());
}

#[test]
fn every_linked_cubin_writes_back_byte_for_byte() {
    // As the driver's JIT links them: the device functions in sections of their own.
    let Some(linked) = common::linked() else {
        return;
    };
    let mut functions = 0;
    for a in linked {
        let c = Cubin::parse(&a.cubin).unwrap_or_else(|e| panic!("{}: {e}", a.name));
        assert_eq!(c.kernels.len(), 1, "{}", a.name);
        assert_eq!(c.kernels[0].name, a.name);
        assert!(c.kernels[0].entry && c.functions.iter().all(|f| !f.entry));
        for f in &c.functions {
            assert!(f.registers.is_some(), "{}: {}: registers", a.name, f.name);
        }
        functions += c.functions.len();
        let out = c.write().unwrap_or_else(|e| panic!("{}: {e}", a.name));
        assert!(out == a.cubin, "{}: written cubin differs", a.name);
    }
    assert!(functions > 0, "no linked cubin holds a device function");
}

#[test]
fn a_built_cubin_reads_back_with_the_same_abi() {
    let Some(lib) = common::library() else { return };
    for a in lib {
        let c = Cubin::parse(&a.cubin).unwrap();
        let k = &c.kernels[0];
        let desc = KernelDesc::from_cubin(&c, k).unwrap();
        let built = build(&desc).unwrap_or_else(|e| panic!("{}: {e}", a.name));
        let b = Cubin::parse(&built).unwrap_or_else(|e| panic!("{}: {e}", a.name));
        let bk = &b.kernels[0];
        assert_eq!(b.text(bk), c.text(k), "{}", a.name);
        assert_eq!(bk.registers, k.registers, "{}", a.name);
        assert_eq!(bk.shared_bytes, k.shared_bytes, "{}", a.name);
        let offs = |k: &quench_sass::cubin::Kernel| {
            k.params
                .iter()
                .map(|p| (p.offset, p.size))
                .collect::<Vec<_>>()
        };
        assert_eq!(offs(bk), offs(k), "{}: parameter layout", a.name);
        assert_eq!(bk.param_bytes, k.param_bytes, "{}", a.name);
        assert_eq!(bk.exit_offsets, k.exit_offsets, "{}", a.name);
        assert_eq!(
            bk.barriers.unwrap_or(0),
            k.barriers.unwrap_or(0),
            "{}",
            a.name
        );
    }
}

#[test]
fn truncated_and_corrupted_cubins_are_errors_not_panics() {
    let Some(lib) = common::library() else { return };
    let bytes = &lib[0].cubin;
    for len in 0..bytes.len() {
        let r = Cubin::parse(&bytes[..len]);
        assert!(r.is_err(), "a cubin truncated to {len} bytes parsed");
    }
    // Every byte of the headers and tables set to a few hostile values: an error or a
    // cubin, never a panic.
    let mut errors = 0;
    for at in 0..bytes.len() {
        for v in [0x00, 0xff, 0x7f, 0x80] {
            let mut b = bytes.clone();
            b[at] = v;
            if Cubin::parse(&b).is_err() {
                errors += 1;
            }
        }
    }
    assert!(errors > 0);
    let e = Cubin::parse(&bytes[..bytes.len() - 1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("program header table"), "{e}");
    let e = Cubin::parse(b"\x7fELF\x02\x01").unwrap_err().to_string();
    assert!(e.contains("ELF header"), "{e}");
}

#[test]
fn nvdisasm_and_cuobjdump_read_built_cubins() {
    let Some(lib) = common::library() else { return };
    let Some(cuobjdump) = quench_testkit::ok(quench_sass::tools::find("cuobjdump")) else {
        return;
    };
    let Some(nvdisasm) = quench_testkit::ok(quench_sass::tools::find("nvdisasm")) else {
        return;
    };
    // `cuobjdump -sass` runs nvdisasm itself, found on PATH.
    let mut path_dirs: Vec<std::path::PathBuf> =
        nvdisasm.parent().into_iter().map(Into::into).collect();
    if let Some(p) = std::env::var_os("PATH") {
        path_dirs.extend(std::env::split_paths(&p));
    }
    let search_path = std::env::join_paths(path_dirs).unwrap();
    for a in lib.iter().step_by(8) {
        let c = Cubin::parse(&a.cubin).unwrap();
        let desc = KernelDesc::from_cubin(&c, &c.kernels[0]).unwrap();
        let built = build(&desc).unwrap();
        let listing = |b: &[u8]| {
            let text = quench_sass::tools::nvdisasm_cubin(b, &["-c"])
                .unwrap_or_else(|e| panic!("{}: {e}", a.name));
            quench_sass::tools::listing_instructions(&text)
        };
        let (ours, theirs) = (listing(&built), listing(&a.cubin));
        assert!(!ours.is_empty(), "{}", a.name);
        assert_eq!(ours, theirs, "{}: nvdisasm reads different code", a.name);
        let f = quench_sass::tools::TempFile::new("k.cubin", &built).unwrap();
        let path = f.path.to_string_lossy().into_owned();
        for mode in ["-sass", "-elf"] {
            let run = std::process::Command::new(&cuobjdump)
                .args([mode, &path])
                .env("PATH", &search_path)
                .output()
                .unwrap();
            let (out, err) = (
                String::from_utf8_lossy(&run.stdout),
                String::from_utf8_lossy(&run.stderr),
            );
            assert!(
                run.status.success() && out.contains(&a.name) && !err.contains("Invalid ELF"),
                "{}: cuobjdump {mode}: {err}",
                a.name
            );
        }
    }
}
