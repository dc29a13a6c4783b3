//! One row of an Arrow record batch as a JSON object: the values `datasets` gives in
//! Python (`Dataset[i]`), written as JSON.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Date64Type, Float16Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType, UInt16Type,
    UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrowPrimitiveType, RecordBatch};
use arrow_schema::{DataType, TimeUnit};
use redco_core::{Error, Result};
use serde_json::{Map, Number, Value};

/// Nesting deeper than this (lists of lists of structs ...) is refused rather than recursed.
const MAX_DEPTH: usize = 64;

/// Row `row` of `batch` as a JSON object of its columns, in schema order.
pub(crate) fn row(batch: &RecordBatch, row: usize) -> Result<Value> {
    let schema = batch.schema();
    let mut obj = Map::with_capacity(batch.num_columns());
    for (field, col) in schema.fields().iter().zip(batch.columns()) {
        let v = cell(col.as_ref(), row, 0).map_err(|e| in_column(field.name(), e))?;
        obj.insert(field.name().clone(), v);
    }
    Ok(Value::Object(obj))
}

fn in_column(name: &str, e: String) -> Error {
    Error::invalid("data", format!("column `{name}`: {e}"))
}

fn float(x: f64) -> Value {
    // JSON has no NaN or infinity: they read as null, as `json.dumps` cannot write them either
    Number::from_f64(x).map_or(Value::Null, Value::Number)
}

fn prim<T: ArrowPrimitiveType>(a: &dyn Array, i: usize) -> T::Native {
    a.as_primitive::<T>().value(i)
}

/// Value `i` of `a` (`depth` levels down from a column).
fn cell(a: &dyn Array, i: usize, depth: usize) -> std::result::Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err(format!("nested more than {MAX_DEPTH} levels deep"));
    }
    if i >= a.len() {
        return Err(format!("row {i} out of {} values", a.len()));
    }
    if a.is_null(i) {
        return Ok(Value::Null);
    }
    Ok(match a.data_type() {
        DataType::Null => Value::Null,
        DataType::Boolean => Value::Bool(a.as_boolean().value(i)),
        DataType::Int8 => prim::<Int8Type>(a, i).into(),
        DataType::Int16 => prim::<Int16Type>(a, i).into(),
        DataType::Int32 => prim::<Int32Type>(a, i).into(),
        DataType::Int64 => prim::<Int64Type>(a, i).into(),
        DataType::UInt8 => prim::<UInt8Type>(a, i).into(),
        DataType::UInt16 => prim::<UInt16Type>(a, i).into(),
        DataType::UInt32 => prim::<UInt32Type>(a, i).into(),
        DataType::UInt64 => prim::<UInt64Type>(a, i).into(),
        DataType::Float16 => float(prim::<Float16Type>(a, i).to_f64()),
        DataType::Float32 => float(f64::from(prim::<Float32Type>(a, i))),
        DataType::Float64 => float(prim::<Float64Type>(a, i)),
        // dates and times as their stored integers (days, milliseconds, units since the epoch)
        DataType::Date32 => prim::<Date32Type>(a, i).into(),
        DataType::Date64 => prim::<Date64Type>(a, i).into(),
        DataType::Timestamp(unit, _) => match unit {
            TimeUnit::Second => prim::<TimestampSecondType>(a, i),
            TimeUnit::Millisecond => prim::<TimestampMillisecondType>(a, i),
            TimeUnit::Microsecond => prim::<TimestampMicrosecondType>(a, i),
            TimeUnit::Nanosecond => prim::<TimestampNanosecondType>(a, i),
        }
        .into(),
        DataType::Utf8 => Value::String(a.as_string::<i32>().value(i).to_owned()),
        DataType::LargeUtf8 => Value::String(a.as_string::<i64>().value(i).to_owned()),
        DataType::Utf8View => Value::String(a.as_string_view().value(i).to_owned()),
        DataType::Binary => bytes(a.as_binary::<i32>().value(i)),
        DataType::LargeBinary => bytes(a.as_binary::<i64>().value(i)),
        DataType::BinaryView => bytes(a.as_binary_view().value(i)),
        DataType::FixedSizeBinary(_) => bytes(a.as_fixed_size_binary().value(i)),
        DataType::List(_) => list(a.as_list::<i32>().value(i).as_ref(), depth)?,
        DataType::LargeList(_) => list(a.as_list::<i64>().value(i).as_ref(), depth)?,
        DataType::FixedSizeList(_, _) => list(a.as_fixed_size_list().value(i).as_ref(), depth)?,
        DataType::Struct(fields) => {
            let s = a.as_struct();
            let mut obj = Map::with_capacity(fields.len());
            for (f, col) in fields.iter().zip(s.columns()) {
                obj.insert(f.name().clone(), cell(col.as_ref(), i, depth + 1)?);
            }
            Value::Object(obj)
        }
        DataType::Dictionary(key, _) => {
            let (k, values) = match key.as_ref() {
                DataType::Int8 => dict::<Int8Type>(a, i),
                DataType::Int16 => dict::<Int16Type>(a, i),
                DataType::Int32 => dict::<Int32Type>(a, i),
                DataType::Int64 => dict::<Int64Type>(a, i),
                DataType::UInt8 => dict::<UInt8Type>(a, i),
                DataType::UInt16 => dict::<UInt16Type>(a, i),
                DataType::UInt32 => dict::<UInt32Type>(a, i),
                DataType::UInt64 => dict::<UInt64Type>(a, i),
                other => return Err(format!("dictionary keys of type {other} are not supported")),
            };
            match k {
                Some(k) => cell(values, k, depth + 1)?,
                None => Value::Null,
            }
        }
        other => return Err(format!("values of type {other} are not supported")),
    })
}

fn bytes(b: &[u8]) -> Value {
    Value::Array(b.iter().map(|&x| Value::from(x)).collect())
}

fn list(values: &dyn Array, depth: usize) -> std::result::Result<Value, String> {
    (0..values.len()).map(|j| cell(values, j, depth + 1)).collect::<std::result::Result<Vec<_>, _>>().map(Value::Array)
}

fn dict<K: arrow_array::types::ArrowDictionaryKeyType>(a: &dyn Array, i: usize) -> (Option<usize>, &dyn Array) {
    let d = a.as_dictionary::<K>();
    (d.key(i), d.values().as_ref())
}
