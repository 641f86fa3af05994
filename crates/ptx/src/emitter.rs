//! The state of one kernel's emission: registers, labels and the body text.

use std::fmt::Write;

use quench_ir::{Function, Scalar, Type, Value};

use crate::ptype;
use crate::regs::{RegClass, Regs};

/// Errors inside emission are plain messages; `control` attaches the kernel and the
/// IR value they concern.
pub(crate) type Res<T> = Result<T, String>;

pub(crate) struct Emitter<'f> {
    pub f: &'f Function,
    pub regs: Regs,
    pub body: String,
    /// `.param` symbol of each kernel parameter.
    pub param_names: Vec<String>,
    /// Symbol of each shared-memory declaration.
    pub shared_names: Vec<String>,
    labels: u32,
}

impl<'f> Emitter<'f> {
    pub(crate) fn new(
        f: &'f Function,
        param_names: Vec<String>,
        shared_names: Vec<String>,
    ) -> Self {
        Emitter {
            f,
            regs: Regs::new(f.values.len()),
            body: String::new(),
            param_names,
            shared_names,
            labels: 0,
        }
    }

    /// One instruction line (without the trailing `;`).
    pub(crate) fn line(&mut self, inst: impl AsRef<str>) {
        let _ = writeln!(self.body, "\t{};", inst.as_ref());
    }

    pub(crate) fn comment(&mut self, text: impl AsRef<str>) {
        let _ = writeln!(self.body, "\t// {}", text.as_ref());
    }

    pub(crate) fn label(&mut self, name: &str) {
        let _ = writeln!(self.body, "{name}:");
    }

    /// A fresh label number for one `if` or `for`.
    pub(crate) fn label_id(&mut self) -> u32 {
        self.labels += 1;
        self.labels
    }

    pub(crate) fn ty(&self, v: Value) -> Res<Type> {
        self.f
            .values
            .get(v.index())
            .copied()
            .ok_or_else(|| format!("{v} is not a value of this kernel"))
    }

    /// The scalar type of a one-register value (pointers are not scalars here).
    pub(crate) fn scalar(&self, v: Value) -> Res<Scalar> {
        match self.ty(v)? {
            Type::Scalar(s) => Ok(s),
            t => Err(format!("{v} is a {t}, a scalar is needed here")),
        }
    }

    /// Allocate the registers of a newly defined value.
    pub(crate) fn def(&mut self, v: Value) -> Res<Vec<String>> {
        let classes = RegClass::of_type(self.ty(v)?)?;
        let regs: Vec<String> = classes.into_iter().map(|c| self.regs.fresh(c)).collect();
        self.regs.bind(v, regs.clone());
        Ok(regs)
    }

    /// Allocate the register of a newly defined one-register value.
    pub(crate) fn def1(&mut self, v: Value) -> Res<String> {
        let mut regs = self.def(v)?;
        match regs.len() {
            1 => Ok(regs.remove(0)),
            _ => Err(format!("{v} must be a one-register value")),
        }
    }

    pub(crate) fn regs(&self, v: Value) -> Res<Vec<String>> {
        self.regs
            .get(v)
            .map(|r| r.to_vec())
            .ok_or_else(|| format!("{v} is used before it is defined"))
    }

    pub(crate) fn reg1(&self, v: Value) -> Res<String> {
        let mut regs = self.regs(v)?;
        match regs.len() {
            1 => Ok(regs.remove(0)),
            _ => Err(format!("{v} ({}) is not a one-register value", self.ty(v)?)),
        }
    }

    pub(crate) fn temp(&mut self, class: RegClass) -> String {
        self.regs.fresh(class)
    }

    /// Re-extend the low 8 bits of a byte-typed register (see `regs`).
    pub(crate) fn rextend(&mut self, s: Scalar, reg: &str) {
        if ptype::is_byte(s) {
            let (t, from) = if s == Scalar::I8 {
                ("s16", "s8")
            } else {
                ("u16", "u8")
            };
            self.line(format!("cvt.{t}.{from} {reg}, {reg}"));
        }
    }

    /// Copy `src` registers to `dst` registers as if all at once (sources may be
    /// among the destinations, as when a loop yields its carried values permuted).
    pub(crate) fn parallel_copy(&mut self, dst: &[String], src: &[String], classes: &[RegClass]) {
        let clobbers = src
            .iter()
            .enumerate()
            .any(|(i, s)| dst.iter().enumerate().any(|(j, d)| d == s && i != j));
        if clobbers {
            let tmps: Vec<String> = classes.iter().map(|c| self.temp(*c)).collect();
            for ((t, s), c) in tmps.iter().zip(src).zip(classes) {
                self.line(format!("mov{} {t}, {s}", c.mov_type()));
            }
            for ((d, t), c) in dst.iter().zip(&tmps).zip(classes) {
                self.line(format!("mov{} {d}, {t}", c.mov_type()));
            }
        } else {
            for ((d, s), c) in dst.iter().zip(src).zip(classes) {
                if d != s {
                    self.line(format!("mov{} {d}, {s}", c.mov_type()));
                }
            }
        }
    }
}
