//! Tables of results, printed aligned for a terminal or as Markdown for reports.

use std::io::{self, Write};

/// A titled table with notes under it. The first column is a name, the rest are figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub title: String,
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub notes: Vec<String>,
}

impl Table {
    pub fn new(title: impl Into<String>, headers: &[&str]) -> Table {
        Table {
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
}

#[cfg(test)]
mod tests {
    use super::Table;

    fn sample() -> Table {
        let mut table = Table::new("bandwidth", &["path", "GB/s"]);
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
}
