//! How a subcommand's results leave: stdout in the form asked for, and the files asked for,
//! every one known before the run.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;

use super::args::{Args, What};
use super::{ct, dataset, file, link, pipeline, signals};
use crate::json::{self, Schema};
use crate::outputs::Outputs;
use crate::table::Table;
use crate::ui::Ui;

/// The files a subcommand may write: its name (`<name>.json`, `<name>.md`), its tables'
/// names (`<table>.csv`) and its plots, every one it can write, known before it runs.
pub(super) struct Files {
    name: &'static str,
    schema: Schema,
    tables: Vec<String>,
    pub(super) plots: Vec<String>,
}

impl Files {
    pub(super) fn of(what: &What) -> Files {
        let names = |names: &[&str]| names.iter().map(ToString::to_string).collect();
        let (name, schema, tables, plots) = match what {
            What::Link { .. } => ("link", "hetmem.bench.link/1", names(&link::TABLES), names(&link::PLOTS)),
            What::Compare { .. } => (
                "compare",
                "hetmem.bench.compare/1",
                names(&[link::COMPARE_TABLE]),
                names(&link::COMPARE_PLOTS),
            ),
            What::Pipeline { pipelined: true, .. } => {
                ("pipelined", "hetmem.bench.pipelined/2", names(&pipeline::STREAMING_TABLES), Vec::new())
            }
            What::Pipeline { pipelined: false, .. } => {
                let tables: Vec<String> = pipeline::RESOLUTIONS
                    .iter()
                    .map(|&(width, height)| crate::frame_strategies::table_name(width, height))
                    .collect();
                let plots = tables.iter().map(|table| format!("{table}.svg")).collect();
                ("pipeline", "hetmem.bench.pipeline/2", tables, plots)
            }
            What::Ct { .. } => ("ct", "hetmem.bench.ct/1", names(&ct::TABLES), Vec::new()),
            What::Completion { .. } => (
                "completion",
                "hetmem.bench.completion/1",
                names(&[signals::COMPLETION_TABLE]),
                names(&[signals::COMPLETION_PLOT]),
            ),
            What::Dataset { .. } => (
                "dataset",
                "hetmem.bench.dataset/1",
                names(&[dataset::TABLE, dataset::SPARSE_TABLE]),
                Vec::new(),
            ),
            What::File { .. } => ("file", "hetmem.bench.file/1", names(&file::TABLES), Vec::new()),
            What::Pinning { .. } => (
                "pinning",
                "hetmem.bench.pinning/1",
                names(&[signals::PINNING_TABLE]),
                names(&[signals::PINNING_PLOT]),
            ),
        };
        Files { name, schema: Schema(schema), tables, plots }
    }

    /// What `--save DIR` writes.
    pub(super) fn saved(&self, dir: &Path) -> Vec<PathBuf> {
        let mut files = vec![dir.join(format!("{}.json", self.name)), dir.join(format!("{}.md", self.name))];
        files.extend(self.tables.iter().map(|table| dir.join(format!("{table}.csv"))));
        files
    }
}

/// How a subcommand's results leave: stdout in the form asked for, and the files asked for.
pub(super) struct Emit<'a> {
    pub(super) args: &'a Args,
    pub(super) ui: Ui,
    pub(super) outputs: Outputs,
    pub(super) files: Files,
}

impl Emit<'_> {
    /// Prints the report as asked, and writes the saved forms and plots.
    pub(super) fn all(
        &self,
        report: &impl serde::Serialize,
        tables: &[Table],
        plots: impl FnOnce(&Path) -> anyhow::Result<Vec<PathBuf>>,
    ) -> anyhow::Result<ExitCode> {
        let Emit { args, ui, outputs, files } = self;
        let mut out = std::io::stdout().lock();
        if args.json {
            json::write(&mut out, files.schema, report)?;
        } else {
            for (index, table) in tables.iter().enumerate() {
                if args.markdown {
                    table.write_markdown(&mut out)?;
                } else if args.csv {
                    if index > 0 {
                        out.write_all(b"\r\n")?;
                    }
                    table.write_csv(&mut out)?;
                } else {
                    table.write_text(&mut out)?;
                }
            }
        }
        out.flush()?;
        if let Some(dir) = &args.save {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let name = files.name;
            outputs.write(&dir.join(format!("{name}.json")), json::to_string(files.schema, report)?)?;
            let mut markdown = Vec::new();
            writeln!(markdown, "## hetmem bench {name}\n")?;
            for table in tables {
                table.write_markdown(&mut markdown)?;
            }
            outputs.write(&dir.join(format!("{name}.md")), markdown)?;
            for table in tables {
                debug_assert!(
                    files.tables.contains(&table.name),
                    "{} is not among the files checked",
                    table.name
                );
                let mut csv = Vec::new();
                table.write_csv(&mut csv)?;
                outputs.write(&dir.join(format!("{}.csv", table.name)), csv)?;
            }
        }
        if let Some(dir) = &args.svg {
            for file in plots(dir)? {
                ui.info(format_args!("wrote {}", file.display()));
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}
