//! The compiled decode of apply's driver route: a change topic's record values (the
//! contract's `Change` record, single-object or Schema Registry framed) straight to the
//! envelope fields and the projected row that `apply.lake.driver_plan` builds a
//! `DecodedChange` from, without fastavro's dict per record and per row image.
//!
//! The Python path (`apply.lake.driver_plan._decode`: fastavro's `schemaless_reader`
//! over the writer schema with every logical type but `decimal` read as its physical
//! type) stays the reference and the fallback, and this module gives what it gives:
//! `tests/unit/apply/test_driver_plan_native.py` decodes every column type, edge
//! values, both framings, cut and flipped bodies both ways and compares the results,
//! and `tests/fuzz/fuzz_change_decoder.py` searches for a difference.
//!
//! - **Same acceptance.** Avro's binary encoding
//!   (<https://avro.apache.org/docs/1.12.0/specification/#binary-encoding>) read as
//!   fastavro reads it: bytes after the datum are ignored; an `int` is read as a
//!   `long` (no 32-bit check); a boolean is any byte, true unless 0; a union branch or
//!   enum symbol index is a Python list index, so -1 is the last one; a negative array
//!   block count is followed by a block size that is read and ignored; a string must be
//!   valid UTF-8 (Rust's check and Python's strict decode refuse the same bytes,
//!   surrogates included).
//! - **One deliberate difference.** A varint longer than 10 bytes is malformed here, as
//!   in Java's decoder; fastavro keeps reading it and shifts by the count modulo 64
//!   (undefined behaviour in its C code), which no writer produces.
//! - **Same values.** `decimal` is built by the very calls fastavro makes
//!   (`Context(prec=precision).create_decimal(unscaled).scaleb(-scale)`), in Python.
//! - **Narrow on purpose.** A writer schema outside what this module reads (a
//!   recursive or zero-width type, an envelope field of another type) raises
//!   `ValueError` when the decoder is built, and the caller keeps fastavro for it.
//! - **No panics.** Every read is bounds-checked and ends as [`Malformed`]; nothing is
//!   sized from a count the data gives.

use std::collections::HashMap;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyList, PyString, PyTuple};

/// The single-object encoding's marker, and its header: marker, 8-byte fingerprint.
const SINGLE_OBJECT_MARKER: [u8; 2] = [0xC3, 0x01];
const SINGLE_OBJECT_HEADER: usize = 10;
/// The Schema Registry's magic byte, and its header: magic, 4-byte schema id.
const REGISTRY_MAGIC: u8 = 0x00;
const REGISTRY_HEADER: usize = 5;
/// A writer key: the fingerprint's 8 bytes; a registry id is its last 4, after zeros.
const WRITER_KEY_SIZE: usize = 8;
const REGISTRY_KEY_PAD: usize = WRITER_KEY_SIZE - (REGISTRY_HEADER - 1);
/// The longest varint a 64-bit value takes.
const MAX_VARINT_BYTES: usize = 10;
/// Below this many bytes a decimal's unscaled value has fewer than 963,300 digits, so
/// Python's decimal context (Emax 999,999) cannot overflow building it: a decimal nobody
/// projects is then checked without building it.
const DECIMAL_SAFE_BYTES: usize = 400_000;

/// Why a body does not decode. All of them make the record malformed; they are kept
/// apart for the crate's tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Malformed {
    Truncated,
    VarintTooLong,
    NegativeLength,
    BadUtf8,
    IndexOutOfRange,
    /// Python refused a value (a decimal beyond its context).
    Refused,
}

/// A bounds-checked cursor over a body.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(data: &'a [u8]) -> Self {
        Reader { data, at: 0 }
    }

    fn byte(&mut self) -> Result<u8, Malformed> {
        let byte = *self.data.get(self.at).ok_or(Malformed::Truncated)?;
        self.at += 1;
        Ok(byte)
    }

    fn take(&mut self, count: usize) -> Result<&'a [u8], Malformed> {
        let end = self.at.checked_add(count).ok_or(Malformed::Truncated)?;
        let taken = self.data.get(self.at..end).ok_or(Malformed::Truncated)?;
        self.at = end;
        Ok(taken)
    }

    /// A zig-zag varint. Bits past the 64th (in a 10th byte above 1) are dropped, as
    /// fastavro's and Java's unsigned 64-bit arithmetic drops them.
    fn long(&mut self) -> Result<i64, Malformed> {
        let mut value: u64 = 0;
        for index in 0..MAX_VARINT_BYTES {
            let byte = self.byte()?;
            value |= u64::from(byte & 0x7F).wrapping_shl(7 * index as u32);
            if byte & 0x80 == 0 {
                return Ok(((value >> 1) as i64) ^ -((value & 1) as i64));
            }
        }
        Err(Malformed::VarintTooLong)
    }

    /// A `bytes` or `string` length: negative is malformed, as is one past the end.
    fn length(&mut self) -> Result<usize, Malformed> {
        let length = self.long()?;
        let length = usize::try_from(length).map_err(|_| Malformed::NegativeLength)?;
        if length > self.data.len() - self.at {
            return Err(Malformed::Truncated);
        }
        Ok(length)
    }

    /// A union branch or enum symbol among `count`, indexed as a Python list is.
    fn index(&mut self, count: usize) -> Result<usize, Malformed> {
        let index = self.long()?;
        let count_i = i64::try_from(count).map_err(|_| Malformed::IndexOutOfRange)?;
        if (0..count_i).contains(&index) {
            Ok(index as usize)
        } else if (-count_i..0).contains(&index) {
            Ok((count_i + index) as usize)
        } else {
            Err(Malformed::IndexOutOfRange)
        }
    }

    /// An array or map block: how many items follow, None for the count of 0 that ends
    /// it. A negative count is followed by its block's size in bytes, read and ignored;
    /// `i64::MIN` negated stays negative, as in fastavro's C, and the block then holds no
    /// item (the next count is read).
    fn block(&mut self) -> Result<Option<u64>, Malformed> {
        let count = self.long()?;
        if count == 0 {
            return Ok(None);
        }
        if count < 0 {
            self.long()?;
            return Ok(Some(u64::try_from(count.wrapping_neg()).unwrap_or(0)));
        }
        Ok(Some(count.unsigned_abs()))
    }

    fn utf8(&mut self) -> Result<&'a str, Malformed> {
        let length = self.length()?;
        std::str::from_utf8(self.take(length)?).map_err(|_| Malformed::BadUtf8)
    }
}

/// A named type's place in [`Compiled::named`].
type Named = usize;

/// One Avro type as this module reads it (logical types but `decimal` read as their
/// physical type).
enum Type {
    Null,
    Boolean,
    /// `int` and `long` alike.
    Long,
    Float,
    Double,
    Bytes,
    String,
    Fixed(usize),
    Enum(Vec<Py<PyString>>),
    Array(Box<Type>),
    Map(Box<Type>),
    Union(Vec<Type>),
    /// A record, an enum or a fixed, defined once and referred to by name.
    Ref(Named),
    Decimal(Decimal),
}

/// A record's fields, in order.
struct Record {
    names: Vec<Py<PyString>>,
    types: Vec<Type>,
}

enum NamedType {
    Record(Record),
    Other(Type),
}

/// A `decimal` over `bytes` (`fixed`: `Some(size)`): the context of its precision and its
/// scale, negated, for `scaleb`.
struct Decimal {
    fixed: Option<usize>,
    context: Py<PyAny>,
    exponent: i64,
}

/// The envelope fields `_decode` reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Op,
    CommitLsn,
    Ordinal,
    CommitTs,
    Unchanged,
    Before,
    After,
    Other,
}

impl Role {
    fn of(name: &str) -> Role {
        match name {
            "op" => Role::Op,
            "commit_lsn" => Role::CommitLsn,
            "ordinal" => Role::Ordinal,
            "commit_ts" => Role::CommitTs,
            "unchanged_columns" => Role::Unchanged,
            "before" => Role::Before,
            "after" => Role::After,
            _ => Role::Other,
        }
    }
}

/// A row image's type: `["null", Row]` in either order, or the record alone. Per
/// branch, the record (None: null).
struct Image {
    branches: Option<Vec<Option<Named>>>,
    record: Named,
}

/// The writer schema compiled: its named types and the top record's fields.
struct Compiled {
    named: Vec<NamedType>,
    fields: Vec<(Role, Type)>,
    images: [Image; 2],
}

/// Building a [`Compiled`] from the schema's JSON, parsed by Python's `json`.
struct Compiler<'py> {
    py: Python<'py>,
    named: Vec<Option<NamedType>>,
    names: HashMap<String, Named>,
    decimal_context: Bound<'py, PyAny>,
}

fn refuse<T>(what: impl std::fmt::Display) -> PyResult<T> {
    Err(PyValueError::new_err(format!(
        "the compiled change decoder does not read {what}"
    )))
}

impl<'py> Compiler<'py> {
    fn full_name(name: &str, namespace: &str) -> String {
        if name.contains('.') || namespace.is_empty() {
            name.to_owned()
        } else {
            format!("{namespace}.{name}")
        }
    }

    fn compile(&mut self, schema: &Bound<'py, PyAny>, namespace: &str) -> PyResult<Type> {
        if let Ok(name) = schema.cast::<PyString>() {
            return self.primitive_or_ref(name.to_str()?, namespace);
        }
        if let Ok(branches) = schema.cast::<PyList>() {
            let mut types = Vec::with_capacity(branches.len());
            for branch in branches.iter() {
                types.push(self.compile(&branch, namespace)?);
            }
            return Ok(Type::Union(types));
        }
        let Ok(object) = schema.cast::<PyDict>() else {
            return refuse(format!("the schema {schema}"));
        };
        let Some(kind) = object.get_item("type")? else {
            return refuse("a type without a type");
        };
        let Ok(kind) = kind.cast::<PyString>() else {
            return refuse(format!("the type {kind}"));
        };
        let kind = kind.to_str()?;
        let logical = object.get_item("logicalType")?;
        let decimal = match &logical {
            Some(logical) => logical
                .cast::<PyString>()
                .is_ok_and(|l| l.to_str().is_ok_and(|l| l == "decimal")),
            None => false,
        };
        match kind {
            "record" | "error" | "enum" | "fixed" => {
                self.named_type(object, kind, namespace, decimal)
            }
            "array" => Ok(Type::Array(Box::new(
                self.items(object, "items", namespace)?,
            ))),
            "map" => Ok(Type::Map(Box::new(
                self.items(object, "values", namespace)?,
            ))),
            "bytes" if decimal => self.decimal(object, None),
            _ => self.primitive_or_ref(kind, namespace),
        }
    }

    fn items(&mut self, object: &Bound<'py, PyDict>, key: &str, namespace: &str) -> PyResult<Type> {
        let Some(items) = object.get_item(key)? else {
            return refuse(format!("a container without {key}"));
        };
        let items = self.compile(&items, namespace)?;
        if self.min_width(&items) == 0 {
            // A count the data gives would be read item by item without consuming a byte.
            return refuse("a container of zero-width items");
        }
        Ok(items)
    }

    fn primitive_or_ref(&mut self, name: &str, namespace: &str) -> PyResult<Type> {
        Ok(match name {
            "null" => Type::Null,
            "boolean" => Type::Boolean,
            "int" | "long" => Type::Long,
            "float" => Type::Float,
            "double" => Type::Double,
            "bytes" => Type::Bytes,
            "string" => Type::String,
            _ => {
                let full = Self::full_name(name, namespace);
                let Some(&index) = self.names.get(&full) else {
                    return refuse(format!("the type name {name}"));
                };
                if self.named.get(index).is_none_or(Option::is_none) {
                    return refuse(format!("the recursive type {full}"));
                }
                Type::Ref(index)
            }
        })
    }

    fn decimal(&mut self, object: &Bound<'py, PyDict>, fixed: Option<usize>) -> PyResult<Type> {
        let precision: i64 = match object.get_item("precision")? {
            Some(precision) if !precision.is_instance_of::<PyBool>() => precision.extract()?,
            _ => return refuse("a decimal without an integer precision"),
        };
        let scale: i64 = match object.get_item("scale")? {
            Some(scale) if !scale.is_instance_of::<PyBool>() => scale.extract()?,
            Some(_) => return refuse("a decimal without an integer scale"),
            None => 0,
        };
        if scale < 0 {
            // scaleb would then raise the exponent, which may overflow the context.
            return refuse("a decimal of negative scale");
        }
        let context = self.decimal_context.call0()?;
        context.setattr("prec", precision)?;
        Ok(Type::Decimal(Decimal {
            fixed,
            context: context.unbind(),
            exponent: -scale,
        }))
    }

    fn named_type(
        &mut self,
        object: &Bound<'py, PyDict>,
        kind: &str,
        namespace: &str,
        decimal: bool,
    ) -> PyResult<Type> {
        let name: String = match object.get_item("name")? {
            Some(name) => name.extract()?,
            None => return refuse(format!("a {kind} without a name")),
        };
        let own_namespace: String = match object.get_item("namespace")? {
            Some(space) if !space.is_none() => space.extract()?,
            _ => namespace.to_owned(),
        };
        let full = Self::full_name(&name, &own_namespace);
        if self.names.contains_key(&full) {
            return refuse(format!("a second definition of {full}"));
        }
        let index = self.named.len();
        self.named.push(None);
        self.names.insert(full.clone(), index);
        let inner = full
            .rsplit_once('.')
            .map_or("", |(space, _)| space)
            .to_owned();
        let defined = match kind {
            "record" | "error" => {
                let Some(fields) = object.get_item("fields")? else {
                    return refuse(format!("the record {full} without fields"));
                };
                let fields = fields.cast_into::<PyList>()?;
                let mut record = Record {
                    names: Vec::new(),
                    types: Vec::new(),
                };
                for field in fields.iter() {
                    let field = field.cast_into::<PyDict>()?;
                    let (Some(name), Some(schema)) =
                        (field.get_item("name")?, field.get_item("type")?)
                    else {
                        return refuse(format!("a field of {full} without a name or type"));
                    };
                    let name = name.cast_into::<PyString>()?;
                    if record
                        .names
                        .iter()
                        .any(|known| known.bind(self.py).to_str().ok() == name.to_str().ok())
                    {
                        return refuse(format!("the field {name} twice in {full}"));
                    }
                    record.types.push(self.compile(&schema, &inner)?);
                    record
                        .names
                        .push(PyString::intern(self.py, name.to_str()?).unbind());
                }
                NamedType::Record(record)
            }
            "enum" => {
                let Some(symbols) = object.get_item("symbols")? else {
                    return refuse(format!("the enum {full} without symbols"));
                };
                let symbols = symbols.cast_into::<PyList>()?;
                let mut strings = Vec::with_capacity(symbols.len());
                for symbol in symbols.iter() {
                    let symbol = symbol.cast_into::<PyString>()?;
                    strings.push(PyString::intern(self.py, symbol.to_str()?).unbind());
                }
                NamedType::Other(Type::Enum(strings))
            }
            _ => {
                let size: i64 = match object.get_item("size")? {
                    Some(size) if !size.is_instance_of::<PyBool>() => size.extract()?,
                    _ => return refuse(format!("the fixed {full} without an integer size")),
                };
                let Ok(size) = usize::try_from(size) else {
                    return refuse(format!("the fixed {full} of negative size"));
                };
                if decimal {
                    self.decimal(object, Some(size)).map(NamedType::Other)?
                } else {
                    NamedType::Other(Type::Fixed(size))
                }
            }
        };
        if let Some(slot) = self.named.get_mut(index) {
            *slot = Some(defined);
        }
        Ok(Type::Ref(index))
    }

    /// The fewest bytes a value of `of` takes (a union, at least its branch index).
    fn min_width(&self, of: &Type) -> usize {
        match of {
            Type::Null => 0,
            Type::Fixed(size) => *size,
            Type::Decimal(Decimal {
                fixed: Some(size), ..
            }) => *size,
            Type::Float => 4,
            Type::Double => 8,
            Type::Ref(index) => match self.named.get(*index) {
                Some(Some(NamedType::Record(record))) => {
                    record.types.iter().map(|field| self.min_width(field)).sum()
                }
                Some(Some(NamedType::Other(other))) => self.min_width(other),
                _ => 0,
            },
            _ => 1,
        }
    }
}

impl Compiled {
    fn new(py: Python<'_>, schema_json: &str) -> PyResult<Compiled> {
        let schema = py.import("json")?.call_method1("loads", (schema_json,))?;
        let mut compiler = Compiler {
            py,
            named: Vec::new(),
            names: HashMap::new(),
            decimal_context: py.import("decimal")?.getattr("Context")?,
        };
        let Type::Ref(top) = compiler.compile(&schema, "")? else {
            return refuse("a value schema that is not a record");
        };
        let named: Vec<NamedType> = compiler
            .named
            .into_iter()
            .map(|slot| slot.unwrap_or(NamedType::Other(Type::Null)))
            .collect();
        let Some(NamedType::Record(_)) = named.get(top) else {
            return refuse("a value schema that is not a record");
        };
        // The top record's fields, moved out of the table of named types: it is never
        // referred to by name from inside itself (that would be a recursive type).
        let mut named = named;
        let Some(NamedType::Record(top_record)) = named
            .get_mut(top)
            .map(|slot| std::mem::replace(slot, NamedType::Other(Type::Null)))
        else {
            return refuse("a value schema that is not a record");
        };
        let mut fields = Vec::with_capacity(top_record.types.len());
        let mut images: [Option<Image>; 2] = [None, None];
        for (name, field) in top_record.names.iter().zip(top_record.types) {
            let role = Role::of(name.bind(py).to_str()?);
            let fits = match (role, &field) {
                (Role::Op, Type::String) => true,
                (Role::Op, Type::Ref(index)) => {
                    matches!(named.get(*index), Some(NamedType::Other(Type::Enum(_))))
                }
                (Role::CommitLsn | Role::Ordinal | Role::CommitTs, Type::Long) => true,
                (Role::Unchanged, Type::Array(items)) => matches!(**items, Type::String),
                (Role::Before | Role::After, _) => {
                    let image = Self::image(&named, &field);
                    let fits = image.is_some();
                    images[usize::from(role == Role::After)] = image;
                    fits
                }
                (Role::Other, _) => true,
                _ => false,
            };
            if !fits {
                return refuse(format!("the change record field {name} of this type"));
            }
            fields.push((role, field));
        }
        for role in [
            Role::Op,
            Role::CommitLsn,
            Role::Ordinal,
            Role::CommitTs,
            Role::Unchanged,
        ] {
            if !fields.iter().any(|(known, _)| *known == role) {
                return refuse("a change record without every envelope field");
            }
        }
        let [Some(before), Some(after)] = images else {
            return refuse("a change record without both row images");
        };
        Ok(Compiled {
            named,
            fields,
            images: [before, after],
        })
    }

    fn image(named: &[NamedType], of: &Type) -> Option<Image> {
        let record = |of: &Type| match of {
            Type::Ref(index) if matches!(named.get(*index), Some(NamedType::Record(_))) => {
                Some(*index)
            }
            _ => None,
        };
        match of {
            Type::Union(branches) => {
                let mut records = Vec::with_capacity(branches.len());
                let mut found = None;
                for branch in branches {
                    match branch {
                        Type::Null => records.push(None),
                        other => {
                            let index = record(other)?;
                            if found.is_some_and(|known| known != index) {
                                return None;
                            }
                            found = Some(index);
                            records.push(Some(index));
                        }
                    }
                }
                Some(Image {
                    branches: Some(records),
                    record: found?,
                })
            }
            other => Some(Image {
                branches: None,
                record: record(other)?,
            }),
        }
    }

    fn record(&self, index: Named) -> Option<&Record> {
        match self.named.get(index) {
            Some(NamedType::Record(record)) => Some(record),
            _ => None,
        }
    }

    /// A value of `of` as fastavro gives it.
    fn value<'py>(
        &self,
        py: Python<'py>,
        reader: &mut Reader<'_>,
        of: &Type,
    ) -> Result<Bound<'py, PyAny>, Malformed> {
        Ok(match of {
            Type::Null => py.None().into_bound(py),
            Type::Boolean => PyBool::new(py, reader.byte()? != 0).to_owned().into_any(),
            Type::Long => long_object(py, reader.long()?),
            Type::Float => {
                let bytes = reader.take(4)?;
                let bits = [bytes[0], bytes[1], bytes[2], bytes[3]];
                PyFloat::new(py, f64::from(f32::from_le_bytes(bits))).into_any()
            }
            Type::Double => {
                let mut bits = [0u8; 8];
                bits.copy_from_slice(reader.take(8)?);
                PyFloat::new(py, f64::from_le_bytes(bits)).into_any()
            }
            Type::Bytes => {
                let length = reader.length()?;
                PyBytes::new(py, reader.take(length)?).into_any()
            }
            Type::String => PyString::new(py, reader.utf8()?).into_any(),
            Type::Fixed(size) => PyBytes::new(py, reader.take(*size)?).into_any(),
            Type::Enum(symbols) => {
                let index = reader.index(symbols.len())?;
                symbols
                    .get(index)
                    .ok_or(Malformed::IndexOutOfRange)?
                    .bind(py)
                    .clone()
                    .into_any()
            }
            Type::Array(items) => {
                let list = PyList::empty(py);
                while let Some(count) = reader.block()? {
                    for _ in 0..count {
                        let item = self.value(py, reader, items)?;
                        list.append(item).map_err(|_| Malformed::Refused)?;
                    }
                }
                list.into_any()
            }
            Type::Map(values) => {
                let map = PyDict::new(py);
                while let Some(count) = reader.block()? {
                    for _ in 0..count {
                        let key = PyString::new(py, reader.utf8()?);
                        let value = self.value(py, reader, values)?;
                        map.set_item(key, value).map_err(|_| Malformed::Refused)?;
                    }
                }
                map.into_any()
            }
            Type::Union(branches) => {
                let branch = reader.index(branches.len())?;
                self.value(
                    py,
                    reader,
                    branches.get(branch).ok_or(Malformed::IndexOutOfRange)?,
                )?
            }
            Type::Ref(index) => match self.named.get(*index) {
                Some(NamedType::Record(record)) => {
                    let object = PyDict::new(py);
                    for (name, field) in record.names.iter().zip(&record.types) {
                        let value = self.value(py, reader, field)?;
                        object
                            .set_item(name.bind(py), value)
                            .map_err(|_| Malformed::Refused)?;
                    }
                    object.into_any()
                }
                Some(NamedType::Other(other)) => self.value(py, reader, other)?,
                None => return Err(Malformed::IndexOutOfRange),
            },
            Type::Decimal(decimal) => {
                decimal_object(py, decimal, self.decimal_bytes(reader, decimal)?)?
            }
        })
    }

    fn decimal_bytes<'a>(
        &self,
        reader: &mut Reader<'a>,
        decimal: &Decimal,
    ) -> Result<&'a [u8], Malformed> {
        let length = match decimal.fixed {
            Some(size) => size,
            None => reader.length()?,
        };
        reader.take(length)
    }

    /// Reads a value of `of` as [`Compiled::value`] does, refusing what it refuses,
    /// without building it.
    fn skip(&self, py: Python<'_>, reader: &mut Reader<'_>, of: &Type) -> Result<(), Malformed> {
        match of {
            Type::Null => {}
            Type::Boolean => {
                reader.byte()?;
            }
            Type::Long => {
                reader.long()?;
            }
            Type::Float => {
                reader.take(4)?;
            }
            Type::Double => {
                reader.take(8)?;
            }
            Type::Bytes => {
                let length = reader.length()?;
                reader.take(length)?;
            }
            Type::String => {
                reader.utf8()?;
            }
            Type::Fixed(size) => {
                reader.take(*size)?;
            }
            Type::Enum(symbols) => {
                reader.index(symbols.len())?;
            }
            Type::Array(items) => {
                while let Some(count) = reader.block()? {
                    for _ in 0..count {
                        self.skip(py, reader, items)?;
                    }
                }
            }
            Type::Map(values) => {
                while let Some(count) = reader.block()? {
                    for _ in 0..count {
                        reader.utf8()?;
                        self.skip(py, reader, values)?;
                    }
                }
            }
            Type::Union(branches) => {
                let branch = reader.index(branches.len())?;
                self.skip(
                    py,
                    reader,
                    branches.get(branch).ok_or(Malformed::IndexOutOfRange)?,
                )?;
            }
            Type::Ref(index) => match self.named.get(*index) {
                Some(NamedType::Record(record)) => {
                    for field in &record.types {
                        self.skip(py, reader, field)?;
                    }
                }
                Some(NamedType::Other(other)) => self.skip(py, reader, other)?,
                None => return Err(Malformed::IndexOutOfRange),
            },
            Type::Decimal(decimal) => {
                let unscaled = self.decimal_bytes(reader, decimal)?;
                if unscaled.len() >= DECIMAL_SAFE_BYTES {
                    decimal_object(py, decimal, unscaled)?;
                }
            }
        }
        Ok(())
    }

    /// A row image's record read at `reader`, projected: per entry of `projection`, the
    /// field's value (None: the record lacks the field).
    fn project<'py>(
        &self,
        py: Python<'py>,
        reader: &mut Reader<'_>,
        record: &Record,
        projection: &Projection,
    ) -> Result<Bound<'py, PyTuple>, Malformed> {
        let mut values: Vec<Option<Bound<'py, PyAny>>> = Vec::with_capacity(record.types.len());
        for (field, &wanted) in record.types.iter().zip(&projection.wanted) {
            if wanted {
                values.push(Some(self.value(py, reader, field)?));
            } else {
                self.skip(py, reader, field)?;
                values.push(None);
            }
        }
        let row =
            projection
                .fields
                .iter()
                .map(|slot| match slot.and_then(|index| values.get(index)) {
                    Some(Some(value)) => value.clone(),
                    _ => py.None().into_bound(py),
                });
        PyTuple::new(py, row).map_err(|_| Malformed::Refused)
    }
}

fn long_object(py: Python<'_>, value: i64) -> Bound<'_, PyAny> {
    match value.into_pyobject(py) {
        Ok(object) => object.into_any(),
        Err(never) => match never {},
    }
}

/// fastavro's `read_decimal`: the unscaled value from big-endian two's complement,
/// rounded to the precision by the context, then scaled.
fn decimal_object<'py>(
    py: Python<'py>,
    decimal: &Decimal,
    unscaled: &[u8],
) -> Result<Bound<'py, PyAny>, Malformed> {
    let integer = if unscaled.len() <= 8 {
        let fill = if unscaled.first().is_some_and(|first| first & 0x80 != 0) {
            0xFF
        } else {
            0x00
        };
        let mut bytes = [fill; 8];
        bytes[8 - unscaled.len()..].copy_from_slice(unscaled);
        long_object(py, i64::from_be_bytes(bytes))
    } else {
        let signed = PyDict::new(py);
        signed
            .set_item("signed", true)
            .map_err(|_| Malformed::Refused)?;
        py.get_type::<pyo3::types::PyInt>()
            .call_method(
                "from_bytes",
                (PyBytes::new(py, unscaled), "big"),
                Some(&signed),
            )
            .map_err(|_| Malformed::Refused)?
    };
    let context = decimal.context.bind(py);
    context
        .call_method1("create_decimal", (integer,))
        .and_then(|value| value.call_method1("scaleb", (decimal.exponent, context)))
        .map_err(|_| Malformed::Refused)
}

/// What `_decode` builds a `DecodedChange` from, for one record.
#[pyclass(frozen, module = "capture_native")]
pub struct DecodedFields {
    /// The operation's symbol.
    #[pyo3(get)]
    op: Py<PyAny>,
    #[pyo3(get)]
    commit_lsn: i64,
    #[pyo3(get)]
    ordinal: i64,
    #[pyo3(get)]
    commit_ts: i64,
    /// `unchanged_columns`, as a tuple.
    #[pyo3(get)]
    unchanged: Py<PyTuple>,
    /// The row image (`after`, else `before`) projected onto the decoder's names.
    #[pyo3(get)]
    row: Py<PyTuple>,
}

/// A row image's record projected onto the decoder's names.
struct Projection {
    /// Per name, the record field's index (None: the record has no such field).
    fields: Vec<Option<usize>>,
    /// Per record field, whether a name projects it (the others are checked, not built).
    wanted: Vec<bool>,
}

/// The decoder of one writer schema's change records for one projection.
#[pyclass(frozen, module = "capture_native")]
pub struct ChangeDecoder {
    compiled: Compiled,
    key: [u8; WRITER_KEY_SIZE],
    /// Per image: before, after.
    projections: [Projection; 2],
}

impl ChangeDecoder {
    /// The Avro body of `value` when its header names this decoder's writer key
    /// (`driver_plan._body`).
    fn body<'a>(&self, value: &'a [u8]) -> Option<&'a [u8]> {
        if value.len() >= SINGLE_OBJECT_HEADER && value.starts_with(&SINGLE_OBJECT_MARKER) {
            let fingerprint = value.get(SINGLE_OBJECT_MARKER.len()..SINGLE_OBJECT_HEADER)?;
            return (fingerprint == self.key)
                .then(|| value.get(SINGLE_OBJECT_HEADER..))
                .flatten();
        }
        if value.len() >= REGISTRY_HEADER && value.first() == Some(&REGISTRY_MAGIC) {
            let pad_zero = self.key.get(..REGISTRY_KEY_PAD)?.iter().all(|&b| b == 0);
            let id_matches = value.get(1..REGISTRY_HEADER)? == self.key.get(REGISTRY_KEY_PAD..)?;
            return (pad_zero && id_matches)
                .then(|| value.get(REGISTRY_HEADER..))
                .flatten();
        }
        None
    }

    fn decode_one(&self, py: Python<'_>, body: &[u8]) -> Result<DecodedFields, Malformed> {
        let compiled = &self.compiled;
        let mut reader = Reader::new(body);
        let mut op = None;
        let (mut commit_lsn, mut ordinal, mut commit_ts) = (0, 0, 0);
        let mut unchanged: Option<Bound<'_, PyTuple>> = None;
        // Where each image's record starts, when it is not null.
        let mut images: [Option<(usize, Named)>; 2] = [None, None];
        for (role, field) in &compiled.fields {
            match role {
                Role::Op => op = Some(compiled.value(py, &mut reader, field)?),
                Role::CommitLsn => commit_lsn = reader.long()?,
                Role::Ordinal => ordinal = reader.long()?,
                Role::CommitTs => commit_ts = reader.long()?,
                Role::Unchanged => {
                    // An array of strings (Compiled::new checks), nearly always empty:
                    // read into a tuple without the list fastavro builds first.
                    let mut names = Vec::new();
                    while let Some(count) = reader.block()? {
                        for _ in 0..count {
                            names.push(PyString::new(py, reader.utf8()?));
                        }
                    }
                    unchanged = Some(if names.is_empty() {
                        PyTuple::empty(py)
                    } else {
                        PyTuple::new(py, names).map_err(|_| Malformed::Refused)?
                    });
                }
                Role::Before | Role::After => {
                    let slot = usize::from(*role == Role::After);
                    let image = &compiled.images[slot];
                    let record = match &image.branches {
                        Some(branches) => {
                            let branch = reader.index(branches.len())?;
                            *branches.get(branch).ok_or(Malformed::IndexOutOfRange)?
                        }
                        None => Some(image.record),
                    };
                    images[slot] = record.map(|record| (reader.at, record));
                    if let Some(record) = record {
                        compiled.skip(py, &mut reader, &Type::Ref(record))?;
                    }
                }
                Role::Other => compiled.skip(py, &mut reader, field)?,
            }
        }
        let width = self.projections[0].fields.len();
        let row = match (images[1], images[0]) {
            (Some((at, record)), _) => self.row(py, body, at, record, 1)?,
            (None, Some((at, record))) => self.row(py, body, at, record, 0)?,
            (None, None) => {
                PyTuple::new(py, (0..width).map(|_| py.None())).map_err(|_| Malformed::Refused)?
            }
        };
        Ok(DecodedFields {
            op: op.ok_or(Malformed::Refused)?.unbind(),
            commit_lsn,
            ordinal,
            commit_ts,
            unchanged: unchanged.ok_or(Malformed::Refused)?.unbind(),
            row: row.unbind(),
        })
    }

    /// The projected row of the image whose record starts at `at` (read again: it was
    /// checked, not built, on the first pass).
    fn row<'py>(
        &self,
        py: Python<'py>,
        body: &[u8],
        at: usize,
        record: Named,
        slot: usize,
    ) -> Result<Bound<'py, PyTuple>, Malformed> {
        let record = self
            .compiled
            .record(record)
            .ok_or(Malformed::IndexOutOfRange)?;
        let mut reader = Reader { data: body, at };
        self.compiled
            .project(py, &mut reader, record, &self.projections[slot])
    }
}

#[pymethods]
impl ChangeDecoder {
    /// A decoder of the change records written with `schema_json` (the writer schema,
    /// as `ValueSchema.decode_json` holds it) whose header names `writer_key` (the
    /// fingerprint's 8 little-endian bytes), projecting each row image onto `names`
    /// (per table column, the Row field's name, or None). Raises ValueError for a schema
    /// this module does not read: the caller decodes those with fastavro.
    #[new]
    fn new(
        py: Python<'_>,
        schema_json: &str,
        writer_key: &[u8],
        names: Vec<Option<String>>,
    ) -> PyResult<Self> {
        let Ok(key) = <[u8; WRITER_KEY_SIZE]>::try_from(writer_key) else {
            return Err(PyValueError::new_err(format!(
                "a writer key has {WRITER_KEY_SIZE} bytes, not {}",
                writer_key.len()
            )));
        };
        let compiled = Compiled::new(py, schema_json)?;
        let projection = |image: &Image| -> PyResult<Projection> {
            let Some(record) = compiled.record(image.record) else {
                return refuse("a row image that is not a record");
            };
            let mut fields = Vec::with_capacity(names.len());
            for name in &names {
                let mut found = None;
                if let Some(name) = name {
                    for (index, field) in record.names.iter().enumerate() {
                        if field.bind(py).to_str()? == name {
                            found = Some(index);
                        }
                    }
                }
                fields.push(found);
            }
            let mut wanted = vec![false; record.types.len()];
            for index in fields.iter().flatten() {
                if let Some(slot) = wanted.get_mut(*index) {
                    *slot = true;
                }
            }
            Ok(Projection { fields, wanted })
        };
        let projections = [
            projection(&compiled.images[0])?,
            projection(&compiled.images[1])?,
        ];
        Ok(ChangeDecoder {
            compiled,
            key,
            projections,
        })
    }

    /// Each value of `values` decoded: its [`DecodedFields`], or None when its header
    /// names another writer or its body does not decode (`driver_plan._decode`'s None).
    fn decode<'py>(
        &self,
        py: Python<'py>,
        values: &Bound<'py, PyList>,
    ) -> PyResult<Bound<'py, PyList>> {
        let decoded = PyList::empty(py);
        for value in values.iter() {
            let value = value.cast::<PyBytes>()?;
            let fields = self
                .body(value.as_bytes())
                .and_then(|body| self.decode_one(py, body).ok());
            match fields {
                Some(fields) => decoded.append(Bound::new(py, fields)?)?,
                None => decoded.append(py.None())?,
            }
        }
        Ok(decoded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn long(data: &[u8]) -> Result<i64, Malformed> {
        Reader::new(data).long()
    }

    #[test]
    fn varints_are_zig_zag_and_at_most_ten_bytes() {
        assert_eq!(long(&[0x00]), Ok(0));
        assert_eq!(long(&[0x01]), Ok(-1));
        assert_eq!(long(&[0x80, 0x01]), Ok(64));
        let mut max = [0xFF; 10];
        max[9] = 0x01;
        assert_eq!(long(&max), Ok(i64::MIN));
        max[0] = 0xFE;
        assert_eq!(long(&max), Ok(i64::MAX));
        // Bits past the 64th are dropped, as fastavro and Java drop them.
        let mut wide = [0xFF; 10];
        wide[9] = 0x7F;
        assert_eq!(long(&wide), Ok(i64::MIN));
        assert_eq!(long(&[0x80; 11]), Err(Malformed::VarintTooLong));
        assert_eq!(long(&[]), Err(Malformed::Truncated));
        assert_eq!(long(&[0x80, 0x80]), Err(Malformed::Truncated));
    }

    #[test]
    fn lengths_and_indexes_are_checked() {
        assert_eq!(
            Reader::new(&[0x01]).length(),
            Err(Malformed::NegativeLength)
        );
        assert_eq!(
            Reader::new(&[0x04, b'a']).length(),
            Err(Malformed::Truncated)
        );
        assert_eq!(Reader::new(&[0x04, b'a', b'b']).length(), Ok(2));
        // i64::MAX bytes.
        let mut huge = vec![0xFE];
        huge.extend([0xFF; 8]);
        huge.push(0x01);
        assert_eq!(Reader::new(&huge).length(), Err(Malformed::Truncated));
        // A Python list index: -1 is the last of two, 2 and -3 are out of range.
        assert_eq!(Reader::new(&[0x01]).index(2), Ok(1));
        assert_eq!(Reader::new(&[0x03]).index(2), Ok(0));
        assert_eq!(
            Reader::new(&[0x04]).index(2),
            Err(Malformed::IndexOutOfRange)
        );
        assert_eq!(
            Reader::new(&[0x05]).index(2),
            Err(Malformed::IndexOutOfRange)
        );
        assert_eq!(
            Reader::new(&[0x00]).index(0),
            Err(Malformed::IndexOutOfRange)
        );
        assert_eq!(Reader::new(&[0xC4, 0x01]).utf8(), Err(Malformed::Truncated));
        assert_eq!(
            Reader::new(&[0xC3, 0x01]).utf8(),
            Err(Malformed::NegativeLength)
        );
        assert_eq!(
            Reader::new(&[0x04, 0xED, 0xA0]).utf8(),
            Err(Malformed::BadUtf8)
        );
        let mut take = Reader::new(&[1, 2, 3]);
        assert_eq!(take.take(usize::MAX), Err(Malformed::Truncated));
        assert_eq!(take.take(3), Ok(&[1u8, 2, 3][..]));
    }

    #[test]
    fn negative_block_counts_carry_a_size() {
        // -2 items, a block size of 3: two items follow.
        assert_eq!(Reader::new(&[0x03, 0x06]).block(), Ok(Some(2)));
        assert_eq!(Reader::new(&[0x03]).block(), Err(Malformed::Truncated));
        assert_eq!(Reader::new(&[0x00]).block(), Ok(None));
        // i64::MIN items: none, and the array goes on.
        let mut min = vec![0xFF; 9];
        min.push(0x01);
        min.push(0x00);
        assert_eq!(Reader::new(&min).block(), Ok(Some(0)));
    }
}
