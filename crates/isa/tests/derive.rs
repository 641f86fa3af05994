//! The layout derivation, fed with probe outputs simulated from known layouts.

use quench_ir::FragRole;
use quench_isa::mma_layout::{self, derive, derive_ldmatrix, MmaLayout, MmaMeasurement};
use quench_isa::probe_kernels::{slots, MmaElem};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// A hardware layout: coordinates of every slot of A, B and D (slot numbering as the
/// probes use it) and where each C slot lands in D.
struct Hw {
    a: Vec<(u32, u32)>,
    b: Vec<(u32, u32)>,
    d: Vec<(u32, u32)>,
    c_to_d: Vec<u32>,
}

fn slot_parts(i: u32, regs: u32, per: u32) -> (u32, u32, u32) {
    (i / (regs * per), (i / per) % regs, i % per)
}

fn documented(elem: MmaElem) -> Hw {
    let per = elem.per_reg();
    let coords = |role: FragRole, per: u32| {
        let n = slots(elem, role);
        let regs = n / 32 / per;
        (0..n)
            .map(|i| {
                let (l, r, s) = slot_parts(i, regs, per);
                mma_layout::ptx_isa_figure(elem, role, l, r, s)
            })
            .collect::<Vec<_>>()
    };
    let c_n = slots(elem, FragRole::C);
    Hw {
        a: coords(FragRole::A, per),
        b: coords(FragRole::B, per),
        d: coords(FragRole::C, 1),
        c_to_d: (0..c_n).collect(),
    }
}

/// What the probes would read on hardware with layout `hw`.
fn simulate(elem: MmaElem, hw: &Hw) -> MmaMeasurement {
    let launches = if elem == MmaElem::S8 { 2 } else { 1 };
    let mut relation = vec![vec![0.0; hw.a.len() * hw.d.len()]; launches];
    for (a, &(m, k)) in hw.a.iter().enumerate() {
        for (d, &(dm, dn)) in hw.d.iter().enumerate() {
            if dm != m {
                continue;
            }
            let j = hw.b.iter().position(|&c| c == (k, dn)).unwrap() as u32;
            let codes = if elem == MmaElem::S8 {
                vec![j % 127 + 1, j / 127 + 1]
            } else {
                vec![j + 1]
            };
            for (h, code) in codes.into_iter().enumerate() {
                relation[h][a * hw.d.len() + d] = code as f64;
            }
        }
    }
    let mut accumulator = vec![0.0; hw.d.len()];
    for (c, &d) in hw.c_to_d.iter().enumerate() {
        accumulator[d as usize] = (c + 1) as f64;
    }
    MmaMeasurement {
        elem,
        relation,
        accumulator,
    }
}

/// Compute D = A·B + C slot by slot through a derived table.
fn product_via(
    l: &MmaLayout,
    a: &[f64],
    b: &[f64],
    c: &[f64],
    dims: (u32, u32, u32),
    per: u32,
) -> Vec<f64> {
    let (m, n, k) = dims;
    let idx = |e: &[u32; 5], regs: u32, per: u32| ((e[0] * regs + e[1]) * per + e[2]) as usize;
    let a_regs = (l.a.len() as u32) / 32 / per;
    let b_regs = (l.b.len() as u32) / 32 / per;
    let c_regs = (l.d.len() as u32) / 32;
    let mut am = vec![0.0; (m * k) as usize];
    for e in &l.a {
        am[(e[3] * k + e[4]) as usize] = a[idx(e, a_regs, per)];
    }
    let mut bm = vec![0.0; (k * n) as usize];
    for e in &l.b {
        bm[(e[3] * n + e[4]) as usize] = b[idx(e, b_regs, per)];
    }
    let mut cm = vec![0.0; (m * n) as usize];
    for e in &l.c {
        cm[(e[3] * n + e[4]) as usize] = c[idx(e, c_regs, 1)];
    }
    let mut d = vec![f64::NAN; l.d.len()];
    for e in &l.d {
        let (r, col) = (e[3], e[4]);
        let s: f64 = (0..k)
            .map(|kk| am[(r * k + kk) as usize] * bm[(kk * n + col) as usize])
            .sum();
        d[idx(e, c_regs, 1)] = s + cm[(r * n + col) as usize];
    }
    d
}

fn product_on(hw: &Hw, a: &[f64], b: &[f64], c: &[f64]) -> Vec<f64> {
    let mut d = vec![0.0; hw.d.len()];
    for (ds, &(m, n)) in hw.d.iter().enumerate() {
        let mut s = 0.0;
        for (ai, &(am, ak)) in hw.a.iter().enumerate() {
            if am != m {
                continue;
            }
            let bi = hw.b.iter().position(|&x| x == (ak, n)).unwrap();
            s += a[ai] * b[bi];
        }
        d[ds] = s;
    }
    for (ci, &ds) in hw.c_to_d.iter().enumerate() {
        d[ds as usize] += c[ci];
    }
    d
}

fn check_reproduces(elem: MmaElem, hw: &Hw, seed: u64) {
    let table = derive(&simulate(elem, hw)).expect("derivation");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    use rand::Rng;
    let mut draw = |n: usize| {
        (0..n)
            .map(|_| rng.gen_range(-8i32..8) as f64)
            .collect::<Vec<f64>>()
    };
    let (a, b, c) = (draw(hw.a.len()), draw(hw.b.len()), draw(hw.d.len()));
    let want = product_on(hw, &a, &b, &c);
    let got = product_via(&table, &a, &b, &c, elem.shape().dims(), elem.per_reg());
    assert_eq!(
        got,
        want,
        "{}: derived table computes a different product",
        elem.key()
    );
}

#[test]
fn documented_layouts_are_recovered_exactly() {
    for elem in MmaElem::ALL {
        let table = derive(&simulate(elem, &documented(elem))).unwrap();
        assert!(
            mma_layout::agrees_with_ptx_isa(elem, &table),
            "{}",
            elem.key()
        );
        check_reproduces(elem, &documented(elem), 1);
    }
}

#[test]
fn scrambled_layouts_still_give_the_same_product() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for elem in MmaElem::ALL {
        let mut hw = documented(elem);
        hw.a.shuffle(&mut rng);
        hw.b.shuffle(&mut rng);
        hw.d.shuffle(&mut rng);
        hw.c_to_d.shuffle(&mut rng);
        let table = derive(&simulate(elem, &hw)).unwrap();
        assert!(!mma_layout::agrees_with_ptx_isa(elem, &table));
        check_reproduces(elem, &hw, 2);
    }
}

#[test]
fn a_corrupted_measurement_is_refused() {
    for elem in MmaElem::ALL {
        let mut m = simulate(elem, &documented(elem));
        // Move one product to another D slot.
        let i = m.relation[0].iter().position(|v| *v != 0.0).unwrap();
        let v = m.relation[0][i];
        m.relation[0][i] = 0.0;
        let j = (i + 5..m.relation[0].len())
            .find(|j| m.relation[0][*j] == 0.0)
            .unwrap();
        m.relation[0][j] = v;
        if elem == MmaElem::S8 {
            m.relation[1][j] = m.relation[1][i];
            m.relation[1][i] = 0.0;
        }
        assert!(derive(&m).is_err(), "{}", elem.key());
    }
    let mut m = simulate(MmaElem::Bf16, &documented(MmaElem::Bf16));
    m.relation[0][3] = 0.5;
    assert!(derive(&m).is_err());
}

#[test]
fn ldmatrix_words_decode_and_duplicates_are_refused() {
    // Lane l receives, in register r, the row supplied by lane 8r + l/4, columns 2(l%4)..+1.
    let words: Vec<u32> = (0..32u32)
        .flat_map(|l| {
            (0..4u32).map(move |r| {
                let src = 8 * r + l / 4;
                let lo = src * 8 + 2 * (l % 4);
                lo | ((lo + 1) << 16)
            })
        })
        .collect();
    let t = derive_ldmatrix(4, &words).unwrap();
    assert_eq!(t.len(), 256);
    assert_eq!(t[2], [0, 1, 0, 8, 0]);
    let mut dup = words.clone();
    dup[1] = dup[0];
    assert!(derive_ldmatrix(4, &dup).is_err());
}

#[test]
fn the_committed_table_is_what_the_probe_writes() {
    let text = include_str!("../../../isa/sm90/mma_layout.json");
    let table: quench_isa::probe::LayoutTable = serde_json::from_str(text).unwrap();
    assert_eq!(quench_isa::probe::layout_json(&table), text);
    for elem in MmaElem::ALL {
        let l = &table.mma[&elem.key()];
        assert_eq!(l.a.len() as u32, slots(elem, FragRole::A));
        // The measured relation is recomputed from the table: it must be a product.
        let hw = Hw {
            a: l.a.iter().map(|e| (e[3], e[4])).collect(),
            b: l.b.iter().map(|e| (e[3], e[4])).collect(),
            d: l.d.iter().map(|e| (e[3], e[4])).collect(),
            c_to_d: (0..l.d.len() as u32).collect(),
        };
        check_reproduces(elem, &hw, 3);
    }
}
