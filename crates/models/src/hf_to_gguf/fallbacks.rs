//! Notes on tensors stored in another type than asked: one line per kind of fallback,
//! naming the tensors compactly (`blk.N.{attn_q, ffn_up}.weight for N in 0–23`), since a
//! model whose width is not a multiple of 256 has most of its matrices fall back at once.

use crate::GgmlType;

use super::plan::PlannedTensor;

/// The row length and the two types: tensors alike in these share a note.
type Kind = (usize, GgmlType, GgmlType);

/// `blk.N.rest` as `(N, rest)`.
fn layer_of(name: &str) -> Option<(usize, &str)> {
    let (n, rest) = name.strip_prefix("blk.")?.split_once('.')?;
    Some((n.parse().ok()?, rest))
}

/// Sorted layer numbers as runs: `0–23`, `0, 2–5`.
fn ranges(layers: &[usize]) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &n in layers {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == n => *end = n,
            _ => runs.push((n, n)),
        }
    }
    let run = |&(a, b): &(usize, usize)| {
        if a == b {
            a.to_string()
        } else {
            format!("{a}–{b}")
        }
    };
    runs.iter().map(run).collect::<Vec<_>>().join(", ")
}

/// The names of layer tensors with suffixes `rests` in `layers`.
fn layer_names(rests: &[&str], layers: &[usize]) -> String {
    let rest = match rests {
        [one] => (*one).to_owned(),
        _ => match rests
            .iter()
            .map(|r| r.strip_suffix(".weight"))
            .collect::<Option<Vec<_>>>()
        {
            Some(stems) => format!("{{{}}}.weight", stems.join(", ")),
            None => format!("{{{}}}", rests.join(", ")),
        },
    };
    match layers {
        [n] => format!("blk.{n}.{rest}"),
        _ => format!("blk.N.{rest} for N in {}", ranges(layers)),
    }
}

/// The tensors of one kind of fallback: those outside layers by name, layer tensors by
/// suffix with the layers that have them.
struct Group<'a> {
    kind: Kind,
    others: Vec<&'a str>,
    by_suffix: Vec<(&'a str, Vec<usize>)>,
}

/// One note per kind of fallback among `planned`, in output order.
pub fn notes(planned: &[PlannedTensor]) -> Vec<String> {
    let mut kinds: Vec<Group<'_>> = Vec::new();
    for t in planned.iter().filter(|t| t.ggml_type != t.wanted) {
        let kind = (t.cols, t.wanted, t.ggml_type);
        let at = match kinds.iter().position(|g| g.kind == kind) {
            Some(at) => at,
            None => {
                kinds.push(Group {
                    kind,
                    others: Vec::new(),
                    by_suffix: Vec::new(),
                });
                kinds.len() - 1
            }
        };
        let group = &mut kinds[at];
        match layer_of(&t.gguf_name) {
            Some((n, rest)) => match group.by_suffix.iter_mut().find(|(r, _)| *r == rest) {
                Some((_, layers)) => layers.push(n),
                None => group.by_suffix.push((rest, vec![n])),
            },
            None => group.others.push(&t.gguf_name),
        }
    }
    let mut out = Vec::new();
    for Group {
        kind: (cols, wanted, stored),
        others,
        by_suffix,
    } in kinds
    {
        // Suffixes found in the same layers are named together.
        let mut groups: Vec<(Vec<usize>, Vec<&str>)> = Vec::new();
        for (rest, layers) in by_suffix {
            match groups.iter_mut().find(|(l, _)| *l == layers) {
                Some((_, rests)) => rests.push(rest),
                None => groups.push((layers, vec![rest])),
            }
        }
        let names = others
            .into_iter()
            .map(str::to_owned)
            .chain(groups.iter().map(|(l, r)| layer_names(r, l)));
        for name in names {
            out.push(format!(
                "{name}: rows of {cols} elements are not whole {wanted} blocks of {}; stored \
                 as {stored}",
                wanted.block_size()
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hf_to_gguf::plan::{RowOrder, Source};

    fn tensor(name: &str, cols: usize, wanted: GgmlType, stored: GgmlType) -> PlannedTensor {
        PlannedTensor {
            gguf_name: name.to_owned(),
            source: Source::Checkpoint(String::new()),
            rows: 1,
            cols,
            vector: false,
            wanted,
            ggml_type: stored,
            row_order: RowOrder::AsStored,
        }
    }

    #[test]
    fn fallbacks_are_named_by_kind_and_layer_runs() {
        use GgmlType::*;
        let mut planned = vec![tensor("token_embd.weight", 80, Q8_0, F16)];
        for n in 0..4 {
            planned.push(tensor(&format!("blk.{n}.attn_q.weight"), 896, Q4_K, Q8_0));
            planned.push(tensor(&format!("blk.{n}.ffn_up.weight"), 896, Q4_K, Q8_0));
            planned.push(tensor(
                &format!("blk.{n}.ffn_down.weight"),
                4864,
                Q4_K,
                Q4_K,
            ));
            if n != 2 {
                planned.push(tensor(&format!("blk.{n}.ffn_gate.weight"), 896, Q4_K, Q8_0));
            }
        }
        planned.push(tensor("output.weight", 80, Q8_0, F16));
        assert_eq!(
            notes(&planned),
            [
                "token_embd.weight: rows of 80 elements are not whole Q8_0 blocks of 32; \
                 stored as F16",
                "output.weight: rows of 80 elements are not whole Q8_0 blocks of 32; stored \
                 as F16",
                "blk.N.{attn_q, ffn_up}.weight for N in 0–3: rows of 896 elements are not \
                 whole Q4_K blocks of 256; stored as Q8_0",
                "blk.N.ffn_gate.weight for N in 0–1, 3: rows of 896 elements are not whole \
                 Q4_K blocks of 256; stored as Q8_0",
            ]
        );
        assert_eq!(
            notes(&planned[1..2]),
            [
                "blk.0.attn_q.weight: rows of 896 elements are not whole Q4_K blocks of 256; \
              stored as Q8_0"
            ]
        );
    }
}
