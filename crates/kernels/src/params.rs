//! Kernel parameters: named unsigned integers (`rows=4096 cols=4096`).
//!
//! Shapes are parameters of the build, not of the launch: a kernel is specialized to its
//! reduction lengths and tile counts, so loops have constant trip counts and alignment is
//! known when the code is generated. Sizes that vary per launch (a row count that only
//! sets the grid) are still parameters here, because a [`crate::KernelCase`] needs them.

use std::collections::BTreeMap;

use crate::error::KernelError;

/// Parameter values by name.
pub type Params = BTreeMap<String, u64>;

/// One parameter a kernel takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamInfo {
    pub name: &'static str,
    pub default: u64,
    pub doc: &'static str,
}

/// The defaults of `infos` as a map.
pub fn defaults(infos: &[ParamInfo]) -> Params {
    infos
        .iter()
        .map(|p| (p.name.to_string(), p.default))
        .collect()
}

/// Read `key=value` items separated by commas or whitespace onto the defaults. Values are
/// decimal, or hexadecimal with `0x`; `_` may separate digits. Unknown keys, repeated keys
/// and values that are not unsigned integers are errors that name the item.
pub fn parse(kernel: &str, infos: &[ParamInfo], text: &str) -> Result<Params, KernelError> {
    let mut out = defaults(infos);
    let mut seen: Vec<&str> = vec![];
    for item in text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
    {
        let bad = |reason: &str| KernelError::BadParam {
            kernel: kernel.to_string(),
            item: item.to_string(),
            reason: reason.to_string(),
        };
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| bad("expected key=value"))?;
        let (key, value) = (key.trim(), value.trim());
        if !infos.iter().any(|p| p.name == key) {
            return Err(unknown(kernel, infos, key));
        }
        if seen.contains(&key) {
            return Err(bad("the parameter is given twice"));
        }
        seen.push(key);
        let digits = value.replace('_', "");
        let parsed = match digits
            .strip_prefix("0x")
            .or_else(|| digits.strip_prefix("0X"))
        {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => digits.parse::<u64>(),
        };
        let v = parsed.map_err(|_| bad("the value is not an unsigned integer"))?;
        out.insert(key.to_string(), v);
    }
    Ok(out)
}

fn unknown(kernel: &str, infos: &[ParamInfo], key: &str) -> KernelError {
    let known: Vec<&str> = infos.iter().map(|p| p.name).collect();
    KernelError::UnknownParam {
        kernel: kernel.to_string(),
        key: key.to_string(),
        known: known.join(", "),
    }
}

/// Typed access to a parameter map for one kernel: refuses keys it does not know and
/// reports missing keys and out-of-range values by name.
pub(crate) struct Reader<'a> {
    kernel: &'a str,
    params: &'a Params,
}

impl<'a> Reader<'a> {
    pub fn new(
        kernel: &'a str,
        infos: &[ParamInfo],
        params: &'a Params,
    ) -> Result<Reader<'a>, KernelError> {
        if let Some(key) = params
            .keys()
            .find(|k| !infos.iter().any(|p| p.name == k.as_str()))
        {
            return Err(unknown(kernel, infos, key));
        }
        Ok(Reader { kernel, params })
    }

    /// A value in `lo..=hi`.
    pub fn get(&self, key: &str, lo: u64, hi: u64) -> Result<u32, KernelError> {
        let v = *self
            .params
            .get(key)
            .ok_or_else(|| KernelError::MissingParam {
                kernel: self.kernel.to_string(),
                key: key.to_string(),
            })?;
        if v < lo || v > hi {
            return Err(KernelError::BadParam {
                kernel: self.kernel.to_string(),
                item: format!("{key}={v}"),
                reason: format!("must be in {lo}..={hi}"),
            });
        }
        // hi never exceeds u32::MAX at any call site.
        Ok(u32::try_from(v).unwrap_or(u32::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFOS: &[ParamInfo] = &[
        ParamInfo {
            name: "rows",
            default: 4,
            doc: "",
        },
        ParamInfo {
            name: "cols",
            default: 8,
            doc: "",
        },
    ];

    #[test]
    fn applies_items_onto_defaults() {
        let p = parse("k", INFOS, "cols=0x10").unwrap();
        assert_eq!(p["rows"], 4);
        assert_eq!(p["cols"], 16);
        let p = parse("k", INFOS, " rows=1_024, cols=3 ").unwrap();
        assert_eq!((p["rows"], p["cols"]), (1024, 3));
        assert_eq!(parse("k", INFOS, "").unwrap(), defaults(INFOS));
    }

    #[test]
    fn names_what_is_wrong() {
        let e = parse("k", INFOS, "rows=4,colz=3").unwrap_err().to_string();
        assert!(e.contains("`colz`") && e.contains("rows, cols"), "{e}");
        let e = parse("k", INFOS, "rows=-1").unwrap_err().to_string();
        assert!(
            e.contains("rows=-1") && e.contains("unsigned integer"),
            "{e}"
        );
        let e = parse("k", INFOS, "rows").unwrap_err().to_string();
        assert!(e.contains("key=value"), "{e}");
        let e = parse("k", INFOS, "rows=1 rows=2").unwrap_err().to_string();
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn reader_checks_ranges_and_keys() {
        let p = parse("k", INFOS, "rows=5").unwrap();
        let r = Reader::new("k", INFOS, &p).unwrap();
        assert_eq!(r.get("rows", 1, 10).unwrap(), 5);
        let e = r.get("rows", 6, 10).unwrap_err().to_string();
        assert!(e.contains("rows=5") && e.contains("6..=10"), "{e}");
        let mut extra = p.clone();
        extra.insert("depth".into(), 1);
        assert!(Reader::new("k", INFOS, &extra).is_err());
        extra.clear();
        let r = Reader::new("k", INFOS, &extra).unwrap();
        assert!(r
            .get("rows", 0, 1)
            .unwrap_err()
            .to_string()
            .contains("needs parameter `rows`"));
    }
}
