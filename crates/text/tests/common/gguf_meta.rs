//! Just enough of GGUF to read the tokenizer metadata of a model file in tests.

use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::path::Path;

use quench_text::GgufVocab;

#[derive(Debug, Clone)]
pub enum Meta {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Meta>),
}

struct Reader<R: Read>(R);

impl<R: Read> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        self.0.read_exact(&mut b).expect("GGUF truncated");
        b
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
    fn string(&mut self) -> String {
        let n = self.u64() as usize;
        let mut b = vec![0u8; n];
        self.0.read_exact(&mut b).expect("GGUF truncated");
        String::from_utf8(b).expect("GGUF string not UTF-8")
    }
    fn value(&mut self, ty: u32) -> Meta {
        match ty {
            0 => Meta::Int(i64::from(self.bytes::<1>()[0])),
            1 => Meta::Int(i64::from(self.bytes::<1>()[0] as i8)),
            2 => Meta::Int(i64::from(u16::from_le_bytes(self.bytes()))),
            3 => Meta::Int(i64::from(i16::from_le_bytes(self.bytes()))),
            4 => Meta::Int(i64::from(self.u32())),
            5 => Meta::Int(i64::from(i32::from_le_bytes(self.bytes()))),
            6 => Meta::Float(f64::from(f32::from_le_bytes(self.bytes()))),
            7 => Meta::Bool(self.bytes::<1>()[0] != 0),
            8 => Meta::Str(self.string()),
            9 => {
                let item = self.u32();
                let n = self.u64();
                Meta::Array((0..n).map(|_| self.value(item)).collect())
            }
            10 => Meta::Int(self.u64() as i64),
            11 => Meta::Int(i64::from_le_bytes(self.bytes())),
            12 => Meta::Float(f64::from_le_bytes(self.bytes())),
            other => panic!("GGUF value type {other}"),
        }
    }
}

/// All metadata key/values of a GGUF file (the tensor data is not read).
pub fn read_metadata(path: &Path) -> HashMap<String, Meta> {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut r = Reader(BufReader::new(file));
    assert_eq!(&r.bytes::<4>(), b"GGUF", "not a GGUF file");
    let version = r.u32();
    assert!(version >= 2, "GGUF version {version}");
    let _tensors = r.u64();
    let kvs = r.u64();
    (0..kvs)
        .map(|_| {
            let key = r.string();
            let ty = r.u32();
            (key, r.value(ty))
        })
        .collect()
}

fn str_of(m: &Meta) -> String {
    match m {
        Meta::Str(s) => s.clone(),
        other => panic!("expected a string, got {other:?}"),
    }
}

/// The `tokenizer.ggml.*` keys as a [`GgufVocab`], plus the chat template.
pub fn gguf_vocab(path: &Path) -> (GgufVocab, Option<String>) {
    let meta = read_metadata(path);
    let get = |k: &str| meta.get(&format!("tokenizer.ggml.{k}"));
    let list = |k: &str| match get(k) {
        Some(Meta::Array(items)) => Some(items.clone()),
        None => None,
        Some(other) => panic!("{k}: expected an array, got {other:?}"),
    };
    let id = |k: &str| match get(k) {
        Some(Meta::Int(n)) => Some(*n as u32),
        _ => None,
    };
    let flag = |k: &str| match get(k) {
        Some(Meta::Bool(b)) => Some(*b),
        _ => None,
    };
    let vocab = GgufVocab {
        model: get("model").map(str_of).expect("tokenizer.ggml.model"),
        pre: get("pre").map(str_of),
        tokens: list("tokens").expect("tokens").iter().map(str_of).collect(),
        scores: list("scores").map(|s| {
            s.iter()
                .map(|m| match m {
                    Meta::Float(f) => *f as f32,
                    _ => panic!("score"),
                })
                .collect()
        }),
        token_types: list("token_type").map(|s| {
            s.iter()
                .map(|m| match m {
                    Meta::Int(n) => *n as i32,
                    _ => panic!("type"),
                })
                .collect()
        }),
        merges: list("merges").map(|s| s.iter().map(str_of).collect()),
        bos_id: id("bos_token_id"),
        eos_id: id("eos_token_id"),
        unk_id: id("unknown_token_id"),
        pad_id: id("padding_token_id"),
        sep_id: id("seperator_token_id"),
        cls_id: id("cls_token_id"),
        add_bos: flag("add_bos_token"),
        add_eos: flag("add_eos_token"),
        add_space_prefix: flag("add_space_prefix"),
    };
    let template = meta.get("tokenizer.chat_template").map(str_of);
    (vocab, template)
}
