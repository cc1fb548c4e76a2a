//! Encoding and decoding: bound parameters as text (binary formats decoded), outcomes as RowDescription and DataRows (text or binary, per the client's formats),
//! catalog columns in their own types, and errors as ErrorResponse with our SQLSTATE and hint.

use super::*;

pub(super) fn error_info(e: &Error) -> ErrorInfo {
    let mut info = ErrorInfo::new(
        "ERROR".to_owned(),
        e.sqlstate().code().to_owned(),
        e.to_string(),
    );
    info.hint = e.hint().map(str::to_owned);
    info
}

pub(super) fn user_error(e: &Error) -> PgWireError {
    PgWireError::UserError(Box::new(error_info(e)))
}

pub(super) fn pg_type(ty: CellType) -> Type {
    match ty {
        CellType::Int8 => Type::INT8,
        CellType::Int4 => Type::INT4,
        CellType::Float8 => Type::FLOAT8,
        CellType::Text => Type::TEXT,
        CellType::Bool => Type::BOOL,
        CellType::Raw(oid) => Type::from_oid(oid).unwrap_or(Type::TEXT),
    }
}

pub(super) fn parameter_pg_type(ty: crate::policy::ColumnType, declared: Option<&str>) -> Type {
    use crate::policy::ColumnType as C;
    match declared {
        Some("integer" | "int" | "int4") => return Type::INT4,
        Some("smallint" | "int2") => return Type::INT2,
        _ => {}
    }
    match ty {
        C::Integer => Type::INT8,
        // Drivers bind floats more easily than numerics; pgdp casts to numeric itself.
        C::Numeric | C::Float => Type::FLOAT8,
        C::Text => Type::TEXT,
        C::Date => Type::DATE,
        C::Timestamp => Type::TIMESTAMP,
        C::Boolean => Type::BOOL,
    }
}

/// Encodes a catalog value (PostgreSQL text output) in the requested format.
pub(super) fn encode_raw(
    encoder: &mut DataRowEncoder,
    oid: u32,
    value: Option<String>,
    format: FieldFormat,
) -> PgWireResult<()> {
    let ty = Type::from_oid(oid).unwrap_or(Type::TEXT);
    let options = pgwire::types::format::FormatOptions::default();
    if format == FieldFormat::Text || value.is_none() {
        // The text is already PostgreSQL's output; write it as is (no array re-quoting). NULL is
        // the same in both formats (length -1), whatever the type.
        return encoder.encode_field_with_type_and_format(&value, &Type::TEXT, format, &options);
    }
    let type_name = ty.name().to_string();
    let bad = || {
        PgWireError::UserError(Box::new(ErrorInfo::new(
            "ERROR".into(),
            "0A000".into(),
            format!(
                "binary format for catalog columns of type {type_name} is not supported by pgdp"
            ),
        )))
    };
    let parse_err = |_| bad();
    match ty.clone() {
        t if t == Type::INT2 => {
            let v = value
                .map(|x| x.parse::<i16>())
                .transpose()
                .map_err(parse_err)?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::INT4 => {
            let v = value
                .map(|x| x.parse::<i32>())
                .transpose()
                .map_err(parse_err)?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::INT8 => {
            let v = value
                .map(|x| x.parse::<i64>())
                .transpose()
                .map_err(parse_err)?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::OID => {
            let v = value
                .map(|x| x.parse::<u32>())
                .transpose()
                .map_err(parse_err)?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::BOOL => {
            let v = value.map(|x| x == "t");
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::CHAR => {
            // The single-byte "char" (pg_class.relkind and friends): its binary form is the byte.
            let v = value
                .map(|x| match x.as_bytes() {
                    [] => Ok(0i8),
                    [b] => Ok(i8::from_ne_bytes([*b])),
                    _ => Err(()),
                })
                .transpose()
                .map_err(|()| bad())?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::FLOAT4 => {
            let v = value
                .map(|x| x.parse::<f32>())
                .transpose()
                .map_err(|_| bad())?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::FLOAT8 => {
            let v = value
                .map(|x| x.parse::<f64>())
                .transpose()
                .map_err(|_| bad())?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::TEXT || t == Type::VARCHAR || t == Type::NAME || t == Type::BPCHAR => {
            encoder.encode_field_with_type_and_format(&value, &Type::TEXT, format, &options)
        }
        _ => Err(bad()),
    }
}

pub(super) fn fields(columns: &[OutColumn], format: &Format) -> Vec<FieldInfo> {
    columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            FieldInfo::new(
                c.name.clone(),
                None,
                None,
                pg_type(c.ty),
                format.format_for(i),
            )
        })
        .collect()
}

pub(super) fn encode_rows(
    columns: &[OutColumn],
    rows: Vec<Vec<Cell>>,
    format: &Format,
) -> PgWireResult<QueryResponse> {
    let schema = Arc::new(fields(columns, format));
    let mut encoder = DataRowEncoder::new(schema.clone());
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        for (i, (cell, column)) in row.into_iter().zip(columns).enumerate() {
            match (column.ty, cell) {
                (CellType::Raw(oid), cell) => {
                    let value = match cell {
                        Cell::Null => None,
                        Cell::Text(t) => Some(t),
                        Cell::Int(x) => Some(x.to_string()),
                        Cell::Float(x) => Some(x.to_string()),
                        Cell::Bool(b) => Some(if b { "t" } else { "f" }.to_string()),
                    };
                    encode_raw(&mut encoder, oid, value, format.format_for(i))?
                }
                (CellType::Int8, Cell::Int(i)) => encoder.encode_field(&Some(i))?,
                (CellType::Int4, Cell::Int(i)) => {
                    encoder.encode_field(&Some(i32::try_from(i).unwrap_or(i32::MAX)))?
                }
                (CellType::Float8, Cell::Float(f)) => encoder.encode_field(&Some(f))?,
                (CellType::Float8, Cell::Int(i)) => encoder.encode_field(&Some(i as f64))?,
                (CellType::Bool, Cell::Bool(b)) => encoder.encode_field(&Some(b))?,
                (CellType::Text, Cell::Text(t)) => encoder.encode_field(&Some(t))?,
                (CellType::Int8, _) => encoder.encode_field(&None::<i64>)?,
                (CellType::Int4, _) => encoder.encode_field(&None::<i32>)?,
                (CellType::Float8, _) => encoder.encode_field(&None::<f64>)?,
                (CellType::Bool, _) => encoder.encode_field(&None::<bool>)?,
                (CellType::Text, other) => match other {
                    Cell::Null => encoder.encode_field(&None::<String>)?,
                    Cell::Int(i) => encoder.encode_field(&Some(i.to_string()))?,
                    Cell::Float(f) => encoder.encode_field(&Some(f.to_string()))?,
                    Cell::Bool(b) => {
                        encoder.encode_field(&Some(if b { "t" } else { "f" }.to_string()))?
                    }
                    Cell::Text(t) => encoder.encode_field(&Some(t))?,
                },
            }
        }
        out.push(Ok(encoder.take_row()));
    }
    Ok(QueryResponse::new(schema, stream::iter(out)))
}

/// Bound parameters as text, decoding binary formats of the common scalar types.
pub(super) fn parameters_as_text(portal: &Portal<Prepared>) -> Result<Vec<Option<String>>, Error> {
    let types = &portal.statement.statement.parameter_types;
    portal
        .parameters
        .iter()
        .enumerate()
        .map(|(i, raw)| {
            let Some(bytes) = raw else { return Ok(None) };
            if portal.parameter_format.is_text(i) {
                return String::from_utf8(bytes.to_vec())
                    .map(Some)
                    .map_err(|_| Error::Protocol {
                        what: "parameter is not valid UTF-8".into(),
                    });
            }
            let ty = types.get(i).cloned().unwrap_or(Type::TEXT);
            let b = bytes.as_ref();
            let text = match ty {
                t if t == Type::INT2 && b.len() == 2 => {
                    i16::from_be_bytes([b[0], b[1]]).to_string()
                }
                t if t == Type::INT4 && b.len() == 4 => {
                    i32::from_be_bytes([b[0], b[1], b[2], b[3]]).to_string()
                }
                t if t == Type::INT8 && b.len() == 8 => {
                    i64::from_be_bytes(b.try_into().map_err(|_| Error::Protocol {
                        what: "bad int8".into(),
                    })?)
                    .to_string()
                }
                t if t == Type::FLOAT8 && b.len() == 8 => {
                    f64::from_be_bytes(b.try_into().map_err(|_| Error::Protocol {
                        what: "bad float8".into(),
                    })?)
                    .to_string()
                }
                t if t == Type::FLOAT4 && b.len() == 4 => {
                    f32::from_be_bytes([b[0], b[1], b[2], b[3]]).to_string()
                }
                t if t == Type::DATE && b.len() == 4 => {
                    crate::datetime::Date::from_days_since_2000(i32::from_be_bytes([
                        b[0], b[1], b[2], b[3],
                    ]))
                    .to_string()
                }
                t if t == Type::BOOL && b.len() == 1 => {
                    if b[0] != 0 { "true" } else { "false" }.to_string()
                }
                t if t == Type::TEXT
                    || t == Type::VARCHAR
                    || t == Type::UNKNOWN
                    || t == Type::NAME =>
                {
                    String::from_utf8(b.to_vec()).map_err(|_| Error::Protocol {
                        what: "parameter is not valid UTF-8".into(),
                    })?
                }
                other => {
                    return Err(Error::unsupported(
                        format!("binary parameters of type {}", other.name()),
                        "Send this parameter in text format.",
                    ))
                }
            };
            Ok(Some(text))
        })
        .collect()
}

/// The row limit pgdp applies to one Execute asking for `requested` rows (0: all).
pub(super) fn rows_per_execute(requested: i32) -> i32 {
    let cap = i32::try_from(crate::limits::ROWS_PER_EXECUTE_MAX).unwrap_or(i32::MAX);
    if requested <= 0 {
        0
    } else {
        requested.min(cap)
    }
}
