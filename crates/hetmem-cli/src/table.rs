//! Tables of results, printed aligned for a terminal, as Markdown for reports, or as CSV for
//! spreadsheets and scripts.

use std::io::{self, Write};

/// A titled table with notes under it. The first column is a name, the rest are figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// What the table is called in file names (`link_bandwidth`: `link_bandwidth.csv`).
    pub name: String,
    pub title: String,
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub notes: Vec<String>,
}

impl Table {
    pub fn new(name: impl Into<String>, title: impl Into<String>, headers: &[&str]) -> Table {
        Table {
            name: name.into(),
            title: title.into(),
            headers: headers.iter().map(ToString::to_string).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// Columns padded to their widest cell: names left-aligned, figures right-aligned.
    pub fn write_text(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(out, "{}", self.title)?;
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (column, cell) in row.iter().enumerate() {
                if column < widths.len() {
                    widths[column] = widths[column].max(cell.chars().count());
                }
            }
        }
        let line = |cells: &[String]| {
            cells
                .iter()
                .zip(&widths)
                .enumerate()
                .map(
                    |(column, (cell, &width))| {
                        if column == 0 { format!("{cell:<width$}") } else { format!("{cell:>width$}") }
                    },
                )
                .collect::<Vec<_>>()
                .join("  ")
        };
        writeln!(out, "{}", line(&self.headers).trim_end())?;
        for row in &self.rows {
            writeln!(out, "{}", line(row).trim_end())?;
        }
        for note in &self.notes {
            writeln!(out, "{note}")?;
        }
        writeln!(out)
    }

    /// A Markdown section: the title as a heading, a pipe table, the notes as a list.
    pub fn write_markdown(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(out, "### {}\n", self.title)?;
        let escape = |cell: &String| cell.replace('|', "\\|");
        writeln!(out, "| {} |", self.headers.iter().map(escape).collect::<Vec<_>>().join(" | "))?;
        let align: Vec<&str> = (0..self.headers.len()).map(|c| if c == 0 { "---" } else { "---:" }).collect();
        writeln!(out, "|{}|", align.join("|"))?;
        for row in &self.rows {
            writeln!(out, "| {} |", row.iter().map(escape).collect::<Vec<_>>().join(" | "))?;
        }
        if !self.notes.is_empty() {
            writeln!(out)?;
            for note in &self.notes {
                writeln!(out, "- {note}")?;
            }
        }
        writeln!(out)
    }

    /// CSV (RFC 4180): the header row, then the rows; cells holding a comma, a quote or a line
    /// break are quoted. The title and notes are left out: a CSV holds one table of cells.
    pub fn write_csv(&self, out: &mut impl Write) -> io::Result<()> {
        let cell = |cell: &String| {
            if cell.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", cell.replace('"', "\"\""))
            } else {
                cell.clone()
            }
        };
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            write!(out, "{}\r\n", row.iter().map(cell).collect::<Vec<_>>().join(","))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Table;

    fn sample() -> Table {
        let mut table = Table::new("link_bandwidth", "bandwidth", &["path", "GB/s"]);
        table.row(vec!["zero_copy_read".into(), "51.2".into()]);
        table.row(vec!["a|b".into(), "7".into()]);
        table.note("ceiling 55.3 GB/s");
        table
    }

    #[test]
    fn text_aligns_names_left_and_figures_right() {
        let mut out = Vec::new();
        sample().write_text(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("path            GB/s\n"), "{text}");
        assert!(text.contains("zero_copy_read  51.2\n"), "{text}");
        assert!(text.contains("a|b                7\n"), "{text}");
        assert!(text.contains("ceiling 55.3 GB/s"));
    }

    #[test]
    fn markdown_is_a_pipe_table_with_escaped_cells() {
        let mut out = Vec::new();
        sample().write_markdown(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("### bandwidth\n\n| path | GB/s |\n|---|---:|\n"), "{text}");
        assert!(text.contains("| a\\|b | 7 |"), "{text}");
        assert!(text.contains("- ceiling 55.3 GB/s"));
    }

    #[test]
    fn csv_quotes_only_the_cells_that_need_it() {
        let mut table = sample();
        table.row(vec!["say \"hi\", twice".into(), "1.5 (3%)".into()]);
        let mut out = Vec::new();
        table.write_csv(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "path,GB/s\r\nzero_copy_read,51.2\r\na|b,7\r\n\"say \"\"hi\"\", twice\",1.5 (3%)\r\n"
        );
    }
}
