//! The log on stderr: its level from `-q`/`-v`, unless `HETMEM_LOG` is set, which wins (a
//! filter in `tracing`'s syntax, e.g. `debug` or `hetmem=trace`: it can say more than the
//! flags can).
//!
//! | flags | level |
//! |---|---|
//! | `-q` | error |
//! | none | warn |
//! | `-v` | info |
//! | `-vv` | debug |
//! | `-vvv` | trace |

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

/// The variable that, when set, decides the log filter whatever the flags say.
pub const LOG_ENV: &str = "HETMEM_LOG";

/// Starts the log, at the level the flags or `HETMEM_LOG` give.
pub fn init(quiet: bool, verbose: u8) {
    let (filter, warning) = filter(std::env::var(LOG_ENV).ok(), quiet, verbose);
    // Colours for a terminal only: a log file or a pipe gets plain text.
    let ansi = std::io::stderr().is_terminal();
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).init();
    if let Some(warning) = warning {
        tracing::warn!("{warning}");
    }
}

/// The filter for `HETMEM_LOG`'s value `env` and the flags, and a warning when `env` is not
/// a filter (the flags' level is used then).
fn filter(env: Option<String>, quiet: bool, verbose: u8) -> (EnvFilter, Option<String>) {
    let level = level(quiet, verbose);
    match env.filter(|env| !env.trim().is_empty()) {
        None => (EnvFilter::new(level), None),
        Some(env) => match EnvFilter::try_new(&env) {
            Ok(filter) => (filter, None),
            Err(error) => (
                EnvFilter::new(level),
                Some(format!("{LOG_ENV}={env:?} is not a log filter ({error}): logging at {level}")),
            ),
        },
    }
}

fn level(quiet: bool, verbose: u8) -> &'static str {
    match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        (false, _) => "trace",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_set_the_level_and_hetmem_log_wins() {
        let shown = |env: Option<&str>, quiet, verbose| {
            let (filter, warning) = filter(env.map(String::from), quiet, verbose);
            (filter.to_string(), warning)
        };
        assert_eq!(shown(None, false, 0), ("warn".into(), None));
        assert_eq!(shown(None, true, 0), ("error".into(), None));
        assert_eq!(shown(None, false, 1), ("info".into(), None));
        assert_eq!(shown(None, false, 2), ("debug".into(), None));
        assert_eq!(shown(None, false, 9), ("trace".into(), None));
        assert_eq!(shown(Some("hetmem=debug"), true, 0), ("hetmem=debug".into(), None));
        assert_eq!(shown(Some(""), false, 1), ("info".into(), None), "empty is unset");
        let (level, warning) = shown(Some("hetmem=loud"), false, 1);
        assert_eq!(level, "info");
        assert!(warning.unwrap().contains("HETMEM_LOG=\"hetmem=loud\" is not a log filter"));
    }
}
