//! Files made from the command line's own definition, so they never drift from it: shell
//! completions (`hetmem completions bash`) and the man pages (`hetmem man`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::CommandFactory as _;
use clap_complete::Shell;

use crate::outputs::Outputs;
use crate::ui::Ui;

#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    shell: Shell,
}

#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// Write hetmem.1 and one page per subcommand (hetmem-filter.1, hetmem-bench-link.1, ...)
    /// into this folder instead of printing hetmem.1.
    #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    out: Option<PathBuf>,
}

/// Prints the completion script for a shell on stdout.
pub fn completions(args: &CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut stdout = std::io::stdout().lock();
    clap_complete::generate(args.shell, &mut crate::Cli::command(), "hetmem", &mut stdout);
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Prints the man page on stdout, or writes every page into a folder.
pub fn man(args: &ManArgs, ui: Ui, outputs: Outputs) -> anyhow::Result<ExitCode> {
    let mut command = crate::Cli::command().disable_help_subcommand(true);
    command.build();
    let Some(dir) = &args.out else {
        let mut stdout = std::io::stdout().lock();
        clap_mangen::Man::new(command).render(&mut stdout)?;
        stdout.flush()?;
        return Ok(ExitCode::SUCCESS);
    };
    let mut pages = Vec::new();
    collect(command, &mut pages);
    let files: Vec<PathBuf> = pages.iter().map(|page| dir.join(page.get_filename())).collect();
    outputs.check_all(&files)?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (page, file) in pages.iter().zip(&files) {
        let mut roff = Vec::new();
        page.render(&mut roff)?;
        outputs.write(file, roff)?;
        ui.info(format_args!("wrote {}", file.display()));
    }
    Ok(ExitCode::SUCCESS)
}

/// The page of `command` and of each subcommand it has, at every depth.
fn collect(command: clap::Command, pages: &mut Vec<clap_mangen::Man>) {
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        collect(sub.clone(), pages);
    }
    pages.push(clap_mangen::Man::new(command));
}
