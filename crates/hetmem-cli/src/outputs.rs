//! Output files: one that exists already is refused unless `-y`/`--overwrite` (ffmpeg's
//! habit), and checked before the work that would fill it, not after.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

use anyhow::{Context as _, bail};

/// `-y`/`--overwrite`.
#[derive(Debug, Clone, Copy)]
pub struct Outputs {
    pub overwrite: bool,
}

impl Outputs {
    /// Refuses `path` when it exists and may not be overwritten.
    ///
    /// # Errors
    /// It exists, without `-y`: the message names it and the remedy.
    pub fn check(&self, path: &Path) -> anyhow::Result<()> {
        if !self.overwrite && std::fs::symlink_metadata(path).is_ok() {
            bail!("{}", exists(path));
        }
        Ok(())
    }

    /// Refuses the first of `paths` that exists and may not be overwritten.
    ///
    /// # Errors
    /// As [`Outputs::check`].
    pub fn check_all<P: AsRef<Path>>(&self, paths: impl IntoIterator<Item = P>) -> anyhow::Result<()> {
        paths.into_iter().try_for_each(|path| self.check(path.as_ref()))
    }

    /// Creates `path` for writing: a new file, or with `-y` a file that may exist (emptied).
    /// Without `-y` a file that appeared since [`Outputs::check`] is refused, not replaced.
    ///
    /// # Errors
    /// It exists without `-y`, or cannot be created.
    pub fn create(&self, path: &Path) -> anyhow::Result<File> {
        let mut options = OpenOptions::new();
        options.write(true);
        if self.overwrite {
            options.create(true).truncate(true);
        } else {
            options.create_new(true);
        }
        options.open(path).map_err(|error| match error.kind() {
            io::ErrorKind::AlreadyExists => anyhow::anyhow!("{}", exists(path)),
            _ => anyhow::Error::new(error).context(format!("cannot create {}", path.display())),
        })
    }

    /// Writes `bytes` to `path`, as [`Outputs::create`] creates it.
    ///
    /// # Errors
    /// As [`Outputs::create`], or the write failing.
    pub fn write(&self, path: &Path, bytes: impl AsRef<[u8]>) -> anyhow::Result<()> {
        use std::io::Write as _;
        let mut file = self.create(path)?;
        file.write_all(bytes.as_ref()).with_context(|| format!("writing {}", path.display()))
    }
}

fn exists(path: &Path) -> String {
    format!("{} exists already: pass -y (--overwrite) to replace it, or give another name", path.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_existing_file_is_refused_without_y_and_replaced_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.json");
        let keep = Outputs { overwrite: false };
        keep.check(&path).unwrap();
        keep.write(&path, "first").unwrap();
        let message = keep.check(&path).unwrap_err().to_string();
        assert!(message.contains("out.json exists already: pass -y (--overwrite)"), "{message}");
        let message = keep.write(&path, "second").unwrap_err().to_string();
        assert!(message.contains("pass -y"), "{message}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "first", "not touched");
        let replace = Outputs { overwrite: true };
        replace.check(&path).unwrap();
        replace.write(&path, "2nd").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "2nd", "emptied, then written");
        let message = keep.check_all([dir.path().join("new.md"), path]).unwrap_err().to_string();
        assert!(message.contains("out.json"), "{message}");
    }
}
