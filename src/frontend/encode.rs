//! Encoding and decoding: bound parameters as text (binary formats decoded), outcomes as RowDescription and DataRows (text or binary, per the client's formats),
//! catalog columns in their own types, and errors as ErrorResponse with our SQLSTATE and hint.

use super::*;

pub(super) fn error_info(e: &Error) -> ErrorInfo {
    let severity = if e.ends_session() { "FATAL" } else { "ERROR" };
    let mut info = ErrorInfo::new(
        severity.to_owned(),
        e.sqlstate().code().to_owned(),
        e.to_string(),
    );
    info.hint = e.hint().map(str::to_owned);
    info.detail = e.detail();
    info.position = e.position().map(|p| p.to_string());
    info
}

pub(super) fn user_error(e: &Error) -> PgWireError {
    PgWireError::UserError(Box::new(error_info(e)))
}

pub(super) fn pg_type(ty: CellType) -> Type {
    Type::from_oid(ty.oid()).unwrap_or(Type::TEXT)
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
            encode_cell(&mut encoder, column.ty, cell, format.format_for(i))?;
        }
        out.push(Ok(encoder.take_row()));
    }
    Ok(QueryResponse::new(schema, stream::iter(out)))
}

/// The text of a cell as PostgreSQL prints a value of its type (reals as numerics print: no
/// exponent).
fn cell_text(cell: Cell) -> Option<String> {
    match cell {
        Cell::Null => None,
        Cell::Text(t) => Some(t),
        Cell::Int(x) => Some(x.to_string()),
        Cell::Float(x) => Some(x.to_string()),
        Cell::Bool(b) => Some(if b { "t" } else { "f" }.to_string()),
    }
}

/// PostgreSQL prints a `double precision` in fixed notation when its decimal exponent is
/// below this (DBL_DIG), and from -4 up; in exponent notation otherwise.
const FLOAT8_FIXED_DIGITS: i32 = 15;
/// The same for `real` (FLT_DIG).
const FLOAT4_FIXED_DIGITS: i32 = 6;

/// A real as PostgreSQL's `float8out`/`float4out` print it with the default
/// `extra_float_digits` (1): the shortest digits that read back as the same value, given here
/// as Rust's shortest exponent form (`format!("{v:e}")`: `4.2e1`, `-1e-5`, `NaN`, `inf`),
/// in fixed notation (`42`, `0.0001`) when the exponent lies in [-4, `fixed_digits`), as
/// `1e-05`, `2.5e+16` otherwise, and `NaN`, `Infinity`, `-Infinity`.
fn real_text(scientific: &str, fixed_digits: i32) -> String {
    match scientific {
        "NaN" => return "NaN".into(),
        "inf" => return "Infinity".into(),
        "-inf" => return "-Infinity".into(),
        _ => {}
    }
    let Some((mantissa, exponent)) = scientific.split_once('e') else {
        return scientific.to_string();
    };
    let Ok(exponent) = exponent.parse::<i32>() else {
        return scientific.to_string();
    };
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    if exponent < -4 || exponent >= fixed_digits {
        let exponent_sign = if exponent < 0 { '-' } else { '+' };
        return format!(
            "{sign}{mantissa}e{exponent_sign}{:02}",
            exponent.unsigned_abs()
        );
    }
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let fixed = if exponent < 0 {
        format!("0.{}{digits}", "0".repeat((-exponent - 1) as usize))
    } else {
        let whole = (exponent + 1) as usize;
        if digits.len() <= whole {
            format!("{digits}{}", "0".repeat(whole - digits.len()))
        } else {
            format!("{}.{}", &digits[..whole], &digits[whole..])
        }
    };
    format!("{sign}{fixed}")
}

/// Encodes one released or computed cell as a value of column type `ty`, in `format`.
fn encode_cell(
    encoder: &mut DataRowEncoder,
    ty: CellType,
    cell: Cell,
    format: FieldFormat,
) -> PgWireResult<()> {
    let options = pgwire::types::format::FormatOptions::default();
    let wire = pg_type(ty);
    let unsupported = |what: &str| {
        PgWireError::UserError(Box::new(ErrorInfo::new(
            "ERROR".into(),
            "0A000".into(),
            format!(
                "pgdp cannot send {what} in the binary format of {}",
                wire.name()
            ),
        )))
    };
    match (ty, cell) {
        (CellType::Raw(oid), cell) => encode_raw(encoder, oid, cell_text(cell), format),
        (_, Cell::Null) => {
            encoder.encode_field_with_type_and_format(&None::<i64>, &wire, format, &options)
        }
        (CellType::Int8, Cell::Int(i)) => {
            encoder.encode_field_with_type_and_format(&i, &wire, format, &options)
        }
        (CellType::Int4, Cell::Int(i)) => {
            let v = i32::try_from(i).map_err(|_| unsupported("an out-of-range integer"))?;
            encoder.encode_field_with_type_and_format(&v, &wire, format, &options)
        }
        (CellType::Int2, Cell::Int(i)) => {
            let v = i16::try_from(i).map_err(|_| unsupported("an out-of-range integer"))?;
            encoder.encode_field_with_type_and_format(&v, &wire, format, &options)
        }
        // Reals in text as PostgreSQL prints them (`42`, `1e+16`), not as pgwire does (`42.0`).
        (CellType::Float8, Cell::Float(f)) if format == FieldFormat::Text => {
            let text = real_text(&format!("{f:e}"), FLOAT8_FIXED_DIGITS);
            encoder.encode_field_with_type_and_format(&text, &wire, format, &options)
        }
        (CellType::Float8, Cell::Int(i)) if format == FieldFormat::Text => {
            let text = real_text(&format!("{:e}", i as f64), FLOAT8_FIXED_DIGITS);
            encoder.encode_field_with_type_and_format(&text, &wire, format, &options)
        }
        (CellType::Float4, Cell::Float(f)) if format == FieldFormat::Text => {
            let text = real_text(&format!("{:e}", f as f32), FLOAT4_FIXED_DIGITS);
            encoder.encode_field_with_type_and_format(&text, &wire, format, &options)
        }
        (CellType::Float4, Cell::Int(i)) if format == FieldFormat::Text => {
            let text = real_text(&format!("{:e}", i as f32), FLOAT4_FIXED_DIGITS);
            encoder.encode_field_with_type_and_format(&text, &wire, format, &options)
        }
        (CellType::Float8, Cell::Float(f)) => {
            encoder.encode_field_with_type_and_format(&f, &wire, format, &options)
        }
        (CellType::Float8, Cell::Int(i)) => {
            encoder.encode_field_with_type_and_format(&(i as f64), &wire, format, &options)
        }
        // A released real is a float8 sample; as real it is rounded to the nearest float4.
        (CellType::Float4, Cell::Float(f)) => {
            encoder.encode_field_with_type_and_format(&(f as f32), &wire, format, &options)
        }
        (CellType::Float4, Cell::Int(i)) => {
            encoder.encode_field_with_type_and_format(&(i as f32), &wire, format, &options)
        }
        (CellType::Bool, Cell::Bool(b)) => {
            encoder.encode_field_with_type_and_format(&b, &wire, format, &options)
        }
        (CellType::Text, cell) => {
            encoder.encode_field_with_type_and_format(&cell_text(cell), &wire, format, &options)
        }
        (ty, cell) => {
            let text = cell_text(cell).unwrap_or_default();
            let value = if format == FieldFormat::Text {
                super::binary::Encoded::Text(text)
            } else {
                let bytes = match ty {
                    CellType::Numeric => super::binary::numeric(&text),
                    CellType::Date => super::binary::date(&text),
                    CellType::Timestamp => super::binary::timestamp(&text, false),
                    CellType::Timestamptz => super::binary::timestamp(&text, true),
                    _ => None,
                };
                super::binary::Encoded::Binary(
                    bytes.ok_or_else(|| unsupported(&format!("the value {text}")))?,
                )
            };
            encoder.encode_field_with_type_and_format(&value, &wire, format, &options)
        }
    }
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
                t if t == Type::NUMERIC => super::binary::numeric_text(b).ok_or_else(|| {
                    Error::unsupported(
                        "a NaN or infinite numeric parameter",
                        "Bind a finite number.",
                    )
                })?,
                t if t == Type::FLOAT4 && b.len() == 4 => {
                    f32::from_be_bytes([b[0], b[1], b[2], b[3]]).to_string()
                }
                t if t == Type::DATE && b.len() == 4 => {
                    crate::datetime::Date::from_days_since_2000(i32::from_be_bytes([
                        b[0], b[1], b[2], b[3],
                    ]))
                    .to_string()
                }
                t if (t == Type::TIMESTAMP || t == Type::TIMESTAMPTZ) && b.len() == 8 => {
                    // psycopg 3 and asyncpg send datetimes in binary by default.
                    let micros = i64::from_be_bytes(b.try_into().map_err(|_| Error::Protocol {
                        what: "bad timestamp".into(),
                    })?);
                    crate::datetime::timestamp_text(micros, t == Type::TIMESTAMPTZ).ok_or_else(
                        || {
                            Error::unsupported(
                                format!(
                                    "the {} parameter ±infinity or outside the years 1 to 9999",
                                    t.name()
                                ),
                                "Bind a timestamp in the years 1 to 9999.",
                            )
                        },
                    )?
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reals_print_as_postgresql_prints_them() {
        // PostgreSQL 15: SELECT 1e15::float8, 1e14::float8, … (psql -At).
        let float8 = [
            (1e15, "1e+15"),
            (1e14, "100000000000000"),
            (123456789012345.6, "123456789012345.6"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (42.0, "42"),
            (-0.0, "-0"),
            (0.0, "0"),
            (2.5e16, "2.5e+16"),
            (1e100, "1e+100"),
            (1.5e-7, "1.5e-07"),
            (0.3060798822390917, "0.3060798822390917"),
            (-1753.6665677683845, "-1753.6665677683845"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
            (f64::INFINITY, "Infinity"),
        ];
        for (v, want) in float8 {
            assert_eq!(
                real_text(&format!("{v:e}"), FLOAT8_FIXED_DIGITS),
                want,
                "{v}"
            );
        }
        let float4: [(f32, &str); 4] = [
            (1e6, "1e+06"),
            (1e5, "100000"),
            (123456.7, "123456.7"),
            (0.1, "0.1"),
        ];
        for (v, want) in float4 {
            assert_eq!(
                real_text(&format!("{v:e}"), FLOAT4_FIXED_DIGITS),
                want,
                "{v}"
            );
        }
    }
}
