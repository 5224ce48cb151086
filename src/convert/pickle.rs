//! A minimal pickle VM: just enough of protocols 2-4 to read the `data.pkl` that
//! `torch.save(state_dict)` writes.
//!
//! Nothing is executed: the only callables resolved are `collections.OrderedDict` and torch's
//! tensor-rebuild functions; anything else is an error. Tensors come out as descriptors
//! ([`TensorDesc`]) that point into the checkpoint's storage files; no tensor data is read here.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::rc::Rc;

use crate::error::{Context, Error, Fault, Result};
use crate::{bail, ensure};

/// Element type of a torch storage, from its persistent id (`torch.FloatStorage`, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    BF16,
    I64,
    /// Any other storage class; rejected later, naming the tensor.
    Other(String),
}

impl DType {
    fn from_storage_class(module: &str, name: &str) -> Self {
        match (module, name) {
            ("torch", "FloatStorage") => Self::F32,
            ("torch", "HalfStorage") => Self::F16,
            ("torch", "BFloat16Storage") => Self::BF16,
            ("torch", "LongStorage") => Self::I64,
            _ => Self::Other(format!("{module}.{name}")),
        }
    }

    /// Bytes per element, for the dtypes whose data we can read.
    pub fn size(&self) -> Option<usize> {
        match self {
            Self::F32 => Some(4),
            Self::F16 | Self::BF16 => Some(2),
            Self::I64 => Some(8),
            Self::Other(_) => None,
        }
    }
}

/// A storage file inside the checkpoint zip (`<prefix>/data/<key>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorageRef {
    pub dtype: DType,
    pub key: String,
    /// Element count of the whole storage (several tensors may view one storage).
    pub numel: usize,
}

/// A strided view into a storage, as `torch._utils._rebuild_tensor_v2` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDesc {
    pub storage: StorageRef,
    /// In elements.
    pub offset: usize,
    pub shape: Vec<usize>,
    /// In elements, one per dimension.
    pub stride: Vec<usize>,
}

/// A Python object, as far as this VM models it. Lists and dicts are shared and mutable
/// (the memo hands out references, and SETITEMS/APPENDS mutate after memoisation).
/// Scalar payloads are only ever shown (Debug), hence the allow.
#[allow(dead_code)]
#[derive(Clone, Debug)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Rc<Seq>),
    List(Rc<RefCell<Seq>>),
    /// Insertion-ordered; also used for `collections.OrderedDict`.
    Dict(Rc<RefCell<Pairs>>),
    /// A `module.name` reference pushed by GLOBAL / STACK_GLOBAL.
    Global(Rc<(String, String)>),
    Storage(Rc<StorageRef>),
    Tensor(Rc<TensorDesc>),
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Self::None => "None",
            Self::Bool(_) => "bool",
            Self::Int(_) => "int",
            Self::Float(_) => "float",
            Self::Str(_) => "str",
            Self::Bytes(_) => "bytes",
            Self::Tuple(_) => "tuple",
            Self::List(_) => "list",
            Self::Dict(_) => "dict",
            Self::Global(_) => "global",
            Self::Storage(_) => "storage",
            Self::Tensor(_) => "tensor",
        }
    }

    fn new_dict() -> Self {
        Self::Dict(Rc::default())
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }

    fn as_index(&self, what: &str) -> Result<usize> {
        match self {
            Self::Int(i) => {
                usize::try_from(*i).with_fault(Error::Model, || format!("{what} is negative: {i}"))
            }
            other => bail!(Model, "{what}: expected an int, got {}", other.kind()),
        }
    }

    fn as_index_tuple(&self, what: &str) -> Result<Vec<usize>> {
        match self {
            Self::Tuple(items) => items.iter().map(|v| v.as_index(what)).collect(),
            other => bail!(Model, "{what}: expected a tuple, got {}", other.kind()),
        }
    }
}

/// The items of a tuple or list. Dropping one frees nested containers iteratively: a crafted
/// pickle can nest values deeper than a recursive drop could unwind.
#[derive(Debug, Default)]
pub struct Seq(Vec<Value>);

/// The entries of a dict, in insertion order (dropped like [`Seq`]).
#[derive(Debug, Default)]
pub struct Pairs(Vec<(Value, Value)>);

impl Deref for Seq {
    type Target = Vec<Value>;
    fn deref(&self) -> &Vec<Value> {
        &self.0
    }
}

impl DerefMut for Seq {
    fn deref_mut(&mut self) -> &mut Vec<Value> {
        &mut self.0
    }
}

impl Deref for Pairs {
    type Target = Vec<(Value, Value)>;
    fn deref(&self) -> &Vec<(Value, Value)> {
        &self.0
    }
}

impl DerefMut for Pairs {
    fn deref_mut(&mut self) -> &mut Vec<(Value, Value)> {
        &mut self.0
    }
}

impl Drop for Seq {
    fn drop(&mut self) {
        release(std::mem::take(&mut self.0));
    }
}

impl Drop for Pairs {
    fn drop(&mut self) {
        release(self.0.drain(..).flat_map(|(k, v)| [k, v]).collect());
    }
}

/// Drops `pending` with an explicit work list instead of recursion: each container whose last
/// reference goes here hands its children to the list and is then dropped empty.
fn release(mut pending: Vec<Value>) {
    while let Some(value) = pending.pop() {
        match value {
            Value::Tuple(rc) => {
                if let Ok(mut seq) = Rc::try_unwrap(rc) {
                    pending.append(&mut seq);
                }
            }
            Value::List(rc) => {
                if let Ok(cell) = Rc::try_unwrap(rc) {
                    pending.append(&mut cell.into_inner());
                }
            }
            Value::Dict(rc) => {
                if let Ok(cell) = Rc::try_unwrap(rc) {
                    pending.extend(cell.into_inner().drain(..).flat_map(|(k, v)| [k, v]));
                }
            }
            _ => {}
        }
    }
}

/// Runs the pickle in `data` and returns the object STOP leaves on the stack.
pub fn load(data: &[u8]) -> Result<Value> {
    Machine::new(data).run()
}

/// Flattens a loaded state dict into `(name, tensor)` pairs, in file order.
/// Accepts either the state dict itself or a dict holding it under `state_dict`.
pub fn state_dict_tensors(root: &Value) -> Result<Vec<(String, TensorDesc)>> {
    let outer = as_dict(root)?;
    let nested = outer
        .iter()
        .find(|(k, _)| k.as_str() == Some("state_dict"))
        .map(|(_, v)| as_dict(v))
        .transpose()?;
    // One level only: a pickle can make a dict contain itself.
    let entries: &[(Value, Value)] = nested.as_deref().unwrap_or(&*outer);
    entries
        .iter()
        .map(|(key, value)| {
            let name = key.as_str().with_fault(Error::Model, || {
                format!("state dict key is a {}, not a str", key.kind())
            })?;
            match value {
                Value::Tensor(t) => Ok((name.to_owned(), (**t).clone())),
                other => bail!(
                    Model,
                    "state dict entry {name} is a {}, not a tensor",
                    other.kind()
                ),
            }
        })
        .collect()
}

fn as_dict(v: &Value) -> Result<std::cell::Ref<'_, Pairs>> {
    match v {
        Value::Dict(d) => Ok(d.borrow()),
        other => bail!(Model, "expected a dict, got {}", other.kind()),
    }
}

// Opcodes (pickletools names).
const MARK: u8 = b'(';
const STOP: u8 = b'.';
const POP: u8 = b'0';
const POP_MARK: u8 = b'1';
const DUP: u8 = b'2';
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const NONE: u8 = b'N';
const BINPERSID: u8 = b'Q';
const REDUCE: u8 = b'R';
const BINUNICODE: u8 = b'X';
const EMPTY_LIST: u8 = b']';
const APPEND: u8 = b'a';
const BUILD: u8 = b'b';
const GLOBAL: u8 = b'c';
const APPENDS: u8 = b'e';
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';
const EMPTY_DICT: u8 = b'}';
const BINPUT: u8 = b'q';
const LONG_BINPUT: u8 = b'r';
const SETITEM: u8 = b's';
const TUPLE: u8 = b't';
const SETITEMS: u8 = b'u';
const BINFLOAT: u8 = b'G';
const EMPTY_TUPLE: u8 = b')';
const PROTO: u8 = 0x80;
const TUPLE1: u8 = 0x85;
const TUPLE2: u8 = 0x86;
const TUPLE3: u8 = 0x87;
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const LONG1: u8 = 0x8a;
const SHORT_BINBYTES: u8 = b'C';
const BINBYTES: u8 = b'B';
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE8: u8 = 0x8d;
const STACK_GLOBAL: u8 = 0x93;
const MEMOIZE: u8 = 0x94;
const FRAME: u8 = 0x95;

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Value>,
    /// Stack heights at each open MARK.
    marks: Vec<usize>,
    memo: HashMap<u32, Value>,
}

impl<'a> Machine<'a> {
    fn new(data: &'a [u8]) -> Self {
        Self {
            data,
            pos: 0,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
        }
    }

    fn run(mut self) -> Result<Value> {
        loop {
            let at = self.pos;
            let op = self.take(1).context("pickle ends without STOP")?[0];
            let done = self
                .step(op)
                .with_context(|| format!("pickle opcode 0x{op:02x} at byte {at}"))?;
            if done {
                return self.pop();
            }
        }
    }

    /// Executes one opcode; returns true on STOP.
    fn step(&mut self, op: u8) -> Result<bool> {
        match op {
            PROTO => {
                let version = self.take(1)?[0];
                ensure!(version <= 5, Model, "unsupported pickle protocol {version}");
            }
            FRAME => {
                self.take(8)?; // framing is only a read-ahead hint
            }
            STOP => return Ok(true),
            MARK => self.marks.push(self.stack.len()),
            POP => {
                self.pop()?;
            }
            POP_MARK => {
                self.pop_mark()?;
            }
            DUP => {
                let top = self
                    .stack
                    .last()
                    .fault(Error::Model, "DUP on an empty stack")?
                    .clone();
                self.stack.push(top);
            }
            NONE => self.stack.push(Value::None),
            NEWTRUE => self.stack.push(Value::Bool(true)),
            NEWFALSE => self.stack.push(Value::Bool(false)),
            BININT => {
                let v = i32::from_le_bytes(self.take_array()?);
                self.stack.push(Value::Int(v.into()));
            }
            BININT1 => {
                let v = self.take(1)?[0];
                self.stack.push(Value::Int(v.into()));
            }
            BININT2 => {
                let v = u16::from_le_bytes(self.take_array()?);
                self.stack.push(Value::Int(v.into()));
            }
            LONG1 => {
                let n = usize::from(self.take(1)?[0]);
                let v = long_from_le(self.take(n)?)?;
                self.stack.push(Value::Int(v));
            }
            BINFLOAT => {
                let v = f64::from_be_bytes(self.take_array()?);
                self.stack.push(Value::Float(v));
            }
            SHORT_BINUNICODE => {
                let n = usize::from(self.take(1)?[0]);
                self.push_str(n)?;
            }
            BINUNICODE => {
                let n = u32::from_le_bytes(self.take_array()?);
                self.push_str(n as usize)?;
            }
            BINUNICODE8 => {
                let n = u64::from_le_bytes(self.take_array()?);
                self.push_str(usize::try_from(n).map_err(Error::model)?)?;
            }
            SHORT_BINBYTES => {
                let n = usize::from(self.take(1)?[0]);
                let bytes = self.take(n)?.to_vec();
                self.stack.push(Value::Bytes(bytes));
            }
            BINBYTES => {
                let n = u32::from_le_bytes(self.take_array()?);
                let bytes = self.take(n as usize)?.to_vec();
                self.stack.push(Value::Bytes(bytes));
            }
            EMPTY_TUPLE => self.stack.push(Value::Tuple(Rc::default())),
            EMPTY_LIST => self.stack.push(Value::List(Rc::default())),
            EMPTY_DICT => self.stack.push(Value::new_dict()),
            TUPLE => {
                let items = self.pop_mark()?;
                self.stack.push(Value::Tuple(Rc::new(Seq(items))));
            }
            TUPLE1 | TUPLE2 | TUPLE3 => {
                let items = self.pop_n(usize::from(op - TUPLE1 + 1))?;
                self.stack.push(Value::Tuple(Rc::new(Seq(items))));
            }
            APPEND => {
                let item = self.pop()?;
                self.append(vec![item])?;
            }
            APPENDS => {
                let items = self.pop_mark()?;
                self.append(items)?;
            }
            SETITEM => {
                let value = self.pop()?;
                let key = self.pop()?;
                self.set_items(vec![key, value])?;
            }
            SETITEMS => {
                let items = self.pop_mark()?;
                self.set_items(items)?;
            }
            BINPUT => {
                let i = self.take(1)?[0];
                self.memo_put(i.into())?;
            }
            LONG_BINPUT => {
                let i = u32::from_le_bytes(self.take_array()?);
                self.memo_put(i)?;
            }
            MEMOIZE => {
                let i = u32::try_from(self.memo.len()).map_err(Error::model)?;
                self.memo_put(i)?;
            }
            BINGET => {
                let i = self.take(1)?[0];
                self.memo_get(i.into())?;
            }
            LONG_BINGET => {
                let i = u32::from_le_bytes(self.take_array()?);
                self.memo_get(i)?;
            }
            GLOBAL => {
                let module = self.take_line()?;
                let name = self.take_line()?;
                self.stack.push(Value::Global(Rc::new((module, name))));
            }
            STACK_GLOBAL => {
                let name = self.pop()?;
                let module = self.pop()?;
                match (module, name) {
                    (Value::Str(module), Value::Str(name)) => {
                        self.stack.push(Value::Global(Rc::new((module, name))));
                    }
                    _ => bail!(Model, "STACK_GLOBAL needs two strings"),
                }
            }
            BINPERSID => {
                let pid = self.pop()?;
                self.stack.push(persistent_load(&pid)?);
            }
            REDUCE => {
                let args = self.pop()?;
                let callable = self.pop()?;
                self.stack.push(reduce(&callable, &args)?);
            }
            BUILD => {
                // The only BUILD torch emits on a state dict sets its `_metadata` attribute,
                // which holds module versions we don't need: drop the state, keep the object.
                self.pop()?;
                ensure!(!self.stack.is_empty(), Model, "BUILD on an empty stack");
            }
            _ => bail!(Model, "unsupported pickle opcode 0x{op:02x}"),
        }
        Ok(false)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.data.len());
        let end = end.with_fault(Error::Model, || {
            format!(
                "pickle truncated: need {n} bytes at byte {}, have {}",
                self.pos,
                self.data.len()
            )
        })?;
        let bytes = &self.data[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self
            .take(N)?
            .try_into()
            .expect("take returns exactly N bytes"))
    }

    /// A newline-terminated ASCII argument (GLOBAL's module and name).
    fn take_line(&mut self) -> Result<String> {
        let rest = &self.data[self.pos..];
        let len = rest
            .iter()
            .position(|&b| b == b'\n')
            .fault(Error::Model, "unterminated GLOBAL name")?;
        let line =
            std::str::from_utf8(&rest[..len]).fault(Error::Model, "GLOBAL name is not UTF-8")?;
        self.pos += len + 1;
        Ok(line.to_owned())
    }

    fn push_str(&mut self, n: usize) -> Result<()> {
        let bytes = self.take(n)?;
        let s = std::str::from_utf8(bytes).fault(Error::Model, "string is not UTF-8")?;
        self.stack.push(Value::Str(s.to_owned()));
        Ok(())
    }

    fn pop(&mut self) -> Result<Value> {
        Ok(self.pop_n(1)?.pop().expect("pop_n(1) returns one value"))
    }

    /// Pops the top `n` values (in stack order), never reaching below the innermost MARK.
    fn pop_n(&mut self, n: usize) -> Result<Vec<Value>> {
        let floor = self.marks.last().copied().unwrap_or(0);
        ensure!(self.stack.len() >= floor + n, Model, "stack underflow");
        Ok(self.stack.split_off(self.stack.len() - n))
    }

    fn pop_mark(&mut self) -> Result<Vec<Value>> {
        let mark = self
            .marks
            .pop()
            .fault(Error::Model, "no MARK on the stack")?;
        Ok(self.stack.split_off(mark))
    }

    fn memo_put(&mut self, i: u32) -> Result<()> {
        let top = self
            .stack
            .last()
            .fault(Error::Model, "memo put on an empty stack")?
            .clone();
        self.memo.insert(i, top);
        Ok(())
    }

    fn memo_get(&mut self, i: u32) -> Result<()> {
        let v = self
            .memo
            .get(&i)
            .with_fault(Error::Model, || format!("memo key {i} not set"))?
            .clone();
        self.stack.push(v);
        Ok(())
    }

    fn append(&mut self, items: Vec<Value>) -> Result<()> {
        match self.stack.last() {
            Some(Value::List(list)) => {
                list.borrow_mut().extend(items);
                Ok(())
            }
            Some(other) => bail!(Model, "append to a {}", other.kind()),
            None => bail!(Model, "append on an empty stack"),
        }
    }

    fn set_items(&mut self, items: Vec<Value>) -> Result<()> {
        ensure!(
            items.len().is_multiple_of(2),
            Model,
            "odd number of items for SETITEMS"
        );
        let Some(Value::Dict(dict)) = self.stack.last() else {
            bail!(Model, "SETITEM(S) target is not a dict");
        };
        let mut dict = dict.borrow_mut();
        let mut items = items.into_iter();
        while let (Some(key), Some(value)) = (items.next(), items.next()) {
            // Python semantics: a repeated (string) key overwrites in place.
            let existing = key
                .as_str()
                .and_then(|key| dict.iter_mut().find(|(k, _)| k.as_str() == Some(key)));
            match existing {
                Some(slot) => slot.1 = value,
                None => dict.push((key, value)),
            }
        }
        Ok(())
    }
}

/// Little-endian two's complement, as LONG1 stores it.
fn long_from_le(bytes: &[u8]) -> Result<i64> {
    ensure!(
        bytes.len() <= 8,
        Model,
        "integer of {} bytes does not fit in i64",
        bytes.len()
    );
    let Some(&last) = bytes.last() else {
        return Ok(0);
    };
    let fill = if last & 0x80 != 0 { 0xff } else { 0 };
    let mut buf = [fill; 8];
    buf[..bytes.len()].copy_from_slice(bytes);
    Ok(i64::from_le_bytes(buf))
}

/// torch's persistent ids: `('storage', <storage class>, key, location, numel)`.
fn persistent_load(pid: &Value) -> Result<Value> {
    let Value::Tuple(items) = pid else {
        bail!(Model, "persistent id is a {}, not a tuple", pid.kind());
    };
    match items.as_slice() {
        [
            Value::Str(tag),
            Value::Global(class),
            Value::Str(key),
            _location,
            numel,
        ] if tag == "storage" => {
            let storage = StorageRef {
                dtype: DType::from_storage_class(&class.0, &class.1),
                key: key.clone(),
                numel: numel.as_index("storage size")?,
            };
            Ok(Value::Storage(Rc::new(storage)))
        }
        _ => bail!(
            Model,
            "unsupported persistent id (expected ('storage', class, key, location, numel))"
        ),
    }
}

fn reduce(callable: &Value, args: &Value) -> Result<Value> {
    let Value::Global(global) = callable else {
        bail!(Model, "REDUCE on a {}, not a global", callable.kind());
    };
    let Value::Tuple(args) = args else {
        bail!(Model, "REDUCE arguments are a {}, not a tuple", args.kind());
    };
    match (global.0.as_str(), global.1.as_str()) {
        ("collections", "OrderedDict") if args.is_empty() => Ok(Value::new_dict()),
        ("torch._utils", "_rebuild_tensor_v2") => rebuild_tensor(args),
        // nn.Parameter(tensor, requires_grad, hooks): the tensor is all we need.
        ("torch._utils", "_rebuild_parameter") => match args.first() {
            Some(t @ Value::Tensor(_)) => Ok(t.clone()),
            _ => bail!(Model, "_rebuild_parameter without a tensor"),
        },
        (module, name) => bail!(Model, "unsupported pickle callable {module}.{name}"),
    }
}

/// `_rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, hooks[, meta])`.
fn rebuild_tensor(args: &[Value]) -> Result<Value> {
    ensure!(
        args.len() >= 4,
        Model,
        "_rebuild_tensor_v2 with {} arguments",
        args.len()
    );
    let Value::Storage(storage) = &args[0] else {
        bail!(
            Model,
            "_rebuild_tensor_v2: first argument is a {}, not a storage",
            args[0].kind()
        );
    };
    let shape = args[2].as_index_tuple("tensor size")?;
    let stride = args[3].as_index_tuple("tensor stride")?;
    ensure!(
        shape.len() == stride.len(),
        Model,
        "tensor has {} sizes but {} strides",
        shape.len(),
        stride.len()
    );
    Ok(Value::Tensor(Rc::new(TensorDesc {
        storage: (**storage).clone(),
        offset: args[1].as_index("storage offset")?,
        shape,
        stride,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small builder for hand-written pickles.
    #[derive(Default)]
    struct P(Vec<u8>);

    impl P {
        fn op(mut self, op: u8) -> Self {
            self.0.push(op);
            self
        }
        fn bytes(mut self, b: &[u8]) -> Self {
            self.0.extend_from_slice(b);
            self
        }
        fn str(self, s: &str) -> Self {
            let n = u32::try_from(s.len()).unwrap().to_le_bytes();
            self.op(BINUNICODE).bytes(&n).bytes(s.as_bytes())
        }
        fn int1(self, v: u8) -> Self {
            self.op(BININT1).bytes(&[v])
        }
        fn global(self, module: &str, name: &str) -> Self {
            self.op(GLOBAL)
                .bytes(format!("{module}\n{name}\n").as_bytes())
        }
        /// `_rebuild_tensor_v2(('storage', FloatStorage, key, 'cpu', numel), off, shape, stride)`.
        fn tensor(self, key: &str, numel: u8, off: u8, shape: &[u8], stride: &[u8]) -> Self {
            let mut p = self.global("torch._utils", "_rebuild_tensor_v2").op(MARK);
            p = p
                .op(MARK)
                .str("storage")
                .global("torch", "FloatStorage")
                .str(key)
                .str("cpu");
            p = p.int1(numel).op(TUPLE).op(BINPERSID).int1(off);
            p = p.op(MARK);
            for &s in shape {
                p = p.int1(s);
            }
            p = p.op(TUPLE).op(MARK);
            for &s in stride {
                p = p.int1(s);
            }
            p.op(TUPLE)
                .op(NEWFALSE)
                .op(EMPTY_TUPLE)
                .op(TUPLE)
                .op(REDUCE)
        }
    }

    fn ordered_dict() -> P {
        P::default()
            .op(PROTO)
            .bytes(&[2])
            .global("collections", "OrderedDict")
            .op(EMPTY_TUPLE)
            .op(REDUCE)
    }

    #[test]
    fn reads_a_state_dict() {
        let p = ordered_dict()
            .op(BINPUT)
            .bytes(&[0])
            .op(MARK)
            .str("a.weight")
            .tensor("0", 6, 0, &[2, 3], &[3, 1])
            .str("a.bias")
            .tensor("1", 4, 1, &[3], &[1])
            .op(SETITEMS)
            .op(EMPTY_DICT) // `_metadata`, dropped by BUILD
            .op(BUILD)
            .op(STOP);
        let tensors = state_dict_tensors(&load(&p.0).unwrap()).unwrap();
        assert_eq!(tensors.len(), 2);
        let (name, w) = &tensors[0];
        assert_eq!(name, "a.weight");
        assert_eq!(
            w.storage,
            StorageRef {
                dtype: DType::F32,
                key: "0".into(),
                numel: 6
            }
        );
        assert_eq!(
            (w.offset, w.shape.as_slice(), w.stride.as_slice()),
            (0, &[2, 3][..], &[3, 1][..])
        );
        assert_eq!(tensors[1].0, "a.bias");
        assert_eq!(tensors[1].1.offset, 1);
    }

    #[test]
    fn memo_shares_mutable_containers() {
        // d = {}; memo[0] = d; d['k'] = 1; push memo[0] again -> same dict.
        let p = P::default()
            .op(EMPTY_DICT)
            .op(BINPUT)
            .bytes(&[0])
            .str("k")
            .int1(1)
            .op(SETITEM)
            .op(POP)
            .op(BINGET)
            .bytes(&[0])
            .op(STOP);
        let Value::Dict(d) = load(&p.0).unwrap() else {
            panic!("not a dict")
        };
        assert_eq!(d.borrow().len(), 1);
    }

    #[test]
    fn scalars_and_long_binput() {
        let p = P::default()
            .op(PROTO)
            .bytes(&[2])
            .op(MARK)
            .op(BININT)
            .bytes(&(-5i32).to_le_bytes())
            .op(BININT2)
            .bytes(&513u16.to_le_bytes())
            .op(LONG1)
            .bytes(&[2, 0xff, 0x7f])
            .op(LONG1)
            .bytes(&[1, 0xff])
            .op(BINFLOAT)
            .bytes(&1.5f64.to_be_bytes())
            .op(SHORT_BINUNICODE)
            .bytes(&[2])
            .bytes(b"hi")
            .op(NONE)
            .op(NEWTRUE)
            .op(TUPLE)
            .op(LONG_BINPUT)
            .bytes(&300u32.to_le_bytes())
            .op(POP)
            .op(LONG_BINGET)
            .bytes(&300u32.to_le_bytes())
            .op(STOP);
        let Value::Tuple(t) = load(&p.0).unwrap() else {
            panic!("not a tuple")
        };
        let got: Vec<String> = t.iter().map(|v| format!("{v:?}")).collect();
        assert_eq!(
            got,
            [
                "Int(-5)",
                "Int(513)",
                "Int(32767)",
                "Int(-1)",
                "Float(1.5)",
                "Str(\"hi\")",
                "None",
                "Bool(true)"
            ]
        );
    }

    #[test]
    fn lists_append() {
        let p = P::default()
            .op(EMPTY_LIST)
            .int1(1)
            .op(APPEND)
            .op(MARK)
            .int1(2)
            .int1(3)
            .op(APPENDS)
            .op(STOP);
        let Value::List(l) = load(&p.0).unwrap() else {
            panic!("not a list")
        };
        assert_eq!(l.borrow().len(), 3);
    }

    #[test]
    fn rejects_unknown_opcode() {
        let err = load(&[PROTO, 2, 0xff]).unwrap_err();
        assert!(
            format!("{err:#}").contains("unsupported pickle opcode 0xff"),
            "{err:#}"
        );
    }

    #[test]
    fn rejects_truncated_input() {
        let p = ordered_dict().op(MARK).str("name");
        let cut = &p.0[..p.0.len() - 2];
        let err = load(cut).unwrap_err();
        assert!(format!("{err:#}").contains("truncated"), "{err:#}");
        assert!(format!("{:#}", load(&p.0).unwrap_err()).contains("without STOP"));
    }

    #[test]
    fn every_truncation_and_byte_flip_is_an_error_not_a_panic() {
        let p = ordered_dict()
            .op(BINPUT)
            .bytes(&[0])
            .op(MARK)
            .str("w")
            .tensor("0", 6, 0, &[2, 3], &[3, 1])
            .op(SETITEMS)
            .op(STOP);
        for n in 0..p.0.len() {
            assert!(load(&p.0[..n]).is_err(), "prefix {n}");
        }
        for i in 0..p.0.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut bad = p.0.clone();
                bad[i] ^= flip;
                // Any outcome but a panic is fine; most are errors.
                if let Ok(v) = load(&bad) {
                    let _ = state_dict_tensors(&v);
                }
            }
        }
    }

    #[test]
    fn rejects_unknown_callable() {
        let p = P::default()
            .global("os", "system")
            .str("ls")
            .op(TUPLE1)
            .op(REDUCE)
            .op(STOP);
        let err = load(&p.0).unwrap_err();
        assert!(
            format!("{err:#}").contains("unsupported pickle callable os.system"),
            "{err:#}"
        );
    }

    #[test]
    fn rejects_stack_underflow_and_bad_memo() {
        assert!(load(&[TUPLE2, STOP]).is_err());
        assert!(load(&[MARK, POP, STOP]).is_err());
        assert!(load(&[BINGET, 7, STOP]).is_err());
        assert!(load(&[SETITEM, STOP]).is_err());
        assert!(load(&[BINUNICODE, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(load(&[]).is_err());
    }

    #[test]
    fn self_containing_state_dict_is_not_followed_forever() {
        // d = {}; d['state_dict'] = d
        let p = P::default()
            .op(EMPTY_DICT)
            .op(BINPUT)
            .bytes(&[0])
            .str("state_dict")
            .op(BINGET)
            .bytes(&[0])
            .op(SETITEM)
            .op(STOP);
        assert!(state_dict_tensors(&load(&p.0).unwrap()).is_err());
    }

    #[test]
    fn deep_nesting_drops_without_overflowing_the_stack() {
        let depth = 1_000_000;
        let mut p = P::default().op(EMPTY_TUPLE);
        for _ in 0..depth {
            p = p
                .op(TUPLE1)
                .op(EMPTY_LIST)
                .op(MARK)
                .op(NONE)
                .op(APPENDS)
                .op(TUPLE2);
        }
        let v = load(&p.op(STOP).0).unwrap();
        drop(v);
    }

    #[test]
    fn non_dict_root_is_an_error() {
        let p = P::default().int1(3).op(STOP);
        assert!(state_dict_tensors(&load(&p.0).unwrap()).is_err());
    }

    #[test]
    fn unknown_storage_class_is_kept_for_later() {
        let p = P::default()
            .op(MARK)
            .str("storage")
            .global("torch", "ByteStorage")
            .str("0")
            .str("cpu")
            .int1(4)
            .op(TUPLE)
            .op(BINPERSID)
            .op(STOP);
        let Value::Storage(s) = load(&p.0).unwrap() else {
            panic!("not a storage")
        };
        assert_eq!(s.dtype, DType::Other("torch.ByteStorage".into()));
    }
}
