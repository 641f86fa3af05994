//! Structural mutations of JSON: a byte flip mostly breaks the syntax, so that the checks
//! behind it (a config's validation, a tokenizer's build) are rarely reached. These parse
//! the input, change one node (a boundary number, another type, a copy of another node, a
//! removed or repeated member) and print it again.

use serde_json::{json, Value};

use crate::rng::Rng;

fn count(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(count).sum(),
        Value::Object(o) => o.values().map(count).sum(),
        _ => 0,
    }
}

/// The `k`-th node in pre-order.
fn nth_mut<'a>(v: &'a mut Value, k: &mut usize) -> Option<&'a mut Value> {
    if *k == 0 {
        return Some(v);
    }
    *k -= 1;
    match v {
        Value::Array(a) => {
            for x in a {
                if let Some(found) = nth_mut(x, k) {
                    return Some(found);
                }
            }
        }
        Value::Object(o) => {
            for x in o.values_mut() {
                if let Some(found) = nth_mut(x, k) {
                    return Some(found);
                }
            }
        }
        _ => {}
    }
    None
}

/// A copy of the `k`-th node in pre-order.
fn nth(v: &Value, k: usize) -> Value {
    fn find<'a>(v: &'a Value, k: &mut usize) -> Option<&'a Value> {
        if *k == 0 {
            return Some(v);
        }
        *k -= 1;
        match v {
            Value::Array(a) => a.iter().find_map(|x| find(x, k)),
            Value::Object(o) => o.values().find_map(|x| find(x, k)),
            _ => None,
        }
    }
    let mut k = k;
    find(v, &mut k).cloned().unwrap_or(Value::Null)
}

fn boundary(rng: &mut Rng) -> Value {
    match rng.below(14) {
        0 => json!(0),
        1 => json!(-1),
        2 => json!(1),
        3 => json!(u32::MAX),
        4 => json!(u64::from(u32::MAX) + 1),
        5 => json!(u64::MAX),
        6 => json!(i64::MIN),
        7 => json!(1e308),
        8 => json!(0.5),
        9 => json!(-0.0),
        10 => json!(65536),
        11 => json!(1u64 << 40),
        12 => json!(2),
        _ => json!(rng.below(1000)),
    }
}

fn other_value(rng: &mut Rng, dict: &[&[u8]]) -> Value {
    match rng.below(8) {
        0 => Value::Null,
        1 => json!(true),
        2 => json!(""),
        3 => json!([]),
        4 => json!({}),
        5 => json!("x".repeat(1 << rng.below(12))),
        _ if !dict.is_empty() => {
            let token: &[u8] = dict[rng.below(dict.len())];
            json!(String::from_utf8_lossy(token))
        }
        _ => json!("<s>"),
    }
}

/// One structural change to `v`.
fn mutate_value(rng: &mut Rng, v: &mut Value, dict: &[&[u8]]) {
    let n = count(v);
    let donor = nth(v, rng.below(n));
    // The root is replaced rarely: a document that is not an object stops at the first
    // check.
    let mut k = if n > 1 && !rng.one_in(16) {
        1 + rng.below(n - 1)
    } else {
        rng.below(n)
    };
    let Some(node) = nth_mut(v, &mut k) else {
        return;
    };
    match rng.below(8) {
        0 | 1 => *node = boundary(rng),
        2 => *node = other_value(rng, dict),
        3 => *node = donor,
        4 => match node {
            Value::Array(a) if !a.is_empty() => {
                let i = rng.below(a.len());
                a.remove(i);
            }
            Value::Object(o) if !o.is_empty() => {
                let key = o.keys().nth(rng.below(o.len())).cloned();
                if let Some(key) = key {
                    o.remove(&key);
                }
            }
            _ => *node = Value::Null,
        },
        5 => match node {
            Value::Array(a) if !a.is_empty() => {
                let x = a[rng.below(a.len())].clone();
                let times = 1 + rng.below(4);
                for _ in 0..times {
                    a.insert(rng.below(a.len() + 1), x.clone());
                }
            }
            Value::Object(o) => {
                // A member the format knows (a dictionary token's name), or a stranger.
                let named: String = String::from_utf8_lossy(
                    dict.get(rng.below(dict.len() + 1)).copied().unwrap_or(b""),
                )
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.'))
                .collect();
                let key = if named.is_empty() {
                    format!("k{}", rng.below(4))
                } else {
                    named
                };
                o.insert(key, donor);
            }
            _ => *node = json!([donor]),
        },
        6 => {
            if let Value::String(s) = node {
                // Cut or double a string: tokens, merges, patterns, roles.
                if rng.one_in(2) && !s.is_empty() {
                    let cut = rng.below(s.len());
                    let cut = (0..=cut)
                        .rev()
                        .find(|&i| s.is_char_boundary(i))
                        .unwrap_or(0);
                    s.truncate(cut);
                } else {
                    *s = s.repeat(2);
                }
            } else {
                *node = boundary(rng);
            }
        }
        _ => {
            if let Value::Object(o) = node {
                // Swap two members' values: a string where a number was, and so on.
                let keys: Vec<String> = o.keys().cloned().collect();
                if keys.len() >= 2 {
                    let a = rng.pick(&keys).clone();
                    let b = rng.pick(&keys).clone();
                    let va = o.get(&a).cloned().unwrap_or(Value::Null);
                    let vb = o.get(&b).cloned().unwrap_or(Value::Null);
                    o.insert(a, vb);
                    o.insert(b, va);
                }
            } else {
                *node = other_value(rng, dict);
            }
        }
    }
}

/// A structural mutant of `base` if it is JSON; `None` if it is not.
pub fn mutate(rng: &mut Rng, base: &[u8], dict: &[&[u8]]) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(base).ok()?;
    for _ in 0..1 + rng.below(3) {
        mutate_value(rng, &mut v, dict);
    }
    let text = if rng.one_in(4) {
        serde_json::to_vec_pretty(&v)
    } else {
        serde_json::to_vec(&v)
    };
    text.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_mutants_stay_json_and_change() {
        let base = br#"{"a": [1, 2, {"b": "text"}], "c": null}"#;
        let mut changed = 0;
        for i in 0..100 {
            let m = mutate(&mut Rng::for_input(5, i), base, &[b"tok"]).expect("JSON in");
            let v: Value = serde_json::from_slice(&m).expect("JSON out");
            changed += usize::from(v != serde_json::from_slice::<Value>(base).unwrap());
        }
        assert!(changed > 80, "{changed} of 100 changed");
        assert_eq!(mutate(&mut Rng::new(1), b"{not json", &[]), None);
    }
}
