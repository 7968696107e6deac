//! Every JSON document the CLI writes opens with a `schema` field naming what it is and the
//! version of its fields, `hetmem.<what>/<version>` (`hetmem.bench.link/1`): a reader can
//! tell the documents apart and see a change of fields coming. The version goes up when a
//! field is renamed, removed or changes meaning; new fields do not change it.

use std::io::Write;

/// A document's schema, e.g. `hetmem.doctor/1`.
#[derive(Debug, Clone, Copy)]
pub struct Schema(pub &'static str);

/// `body`'s fields after `schema`: `body` must serialise as a struct or a map.
#[derive(serde::Serialize)]
struct Versioned<'a, T> {
    schema: &'static str,
    #[serde(flatten)]
    body: &'a T,
}

/// The document, pretty-printed, with a final newline.
///
/// # Errors
/// `body` does not serialise as a struct or a map.
pub fn to_string(schema: Schema, body: &impl serde::Serialize) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(&Versioned { schema: schema.0, body })? + "\n")
}

/// Writes the document to `out`.
///
/// # Errors
/// As [`to_string`], or the write failing.
pub fn write(out: &mut impl Write, schema: Schema, body: &impl serde::Serialize) -> anyhow::Result<()> {
    out.write_all(to_string(schema, body)?.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize)]
    struct Body {
        frames: u32,
    }

    #[test]
    fn the_schema_comes_first_and_a_list_is_refused() {
        let text = to_string(Schema("hetmem.test/1"), &Body { frames: 7 }).unwrap();
        assert_eq!(text, "{\n  \"schema\": \"hetmem.test/1\",\n  \"frames\": 7\n}\n");
        assert!(to_string(Schema("hetmem.test/1"), &vec![1, 2]).is_err());
    }
}
