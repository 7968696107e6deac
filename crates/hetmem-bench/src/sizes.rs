//! Transfer sizes: the log-spaced lists the benchmarks sweep, and parsing and printing them
//! (`4KiB`, `64MiB`, `1GiB`).

use hetmem::error::{Error, Result};

/// The sizes from `min` to `max` (inclusive, when on the way), each `factor` times the last.
///
/// # Errors
/// `min` of zero, `max` below `min`, or a factor below 2.
pub fn log_steps(min: usize, max: usize, factor: usize) -> Result<Vec<usize>> {
    if min == 0 || max < min || factor < 2 {
        return Err(Error::invalid(
            "size steps",
            format!("from {min} to {max} by x{factor}: need 0 < min <= max and a factor of at least 2"),
        ));
    }
    let mut sizes = vec![min];
    while let Some(next) = sizes.last().and_then(|last| last.checked_mul(factor)).filter(|&n| n <= max) {
        sizes.push(next);
    }
    Ok(sizes)
}

/// Parses `4096`, `4K`, `4KiB`, `64M`, `64MiB`, `1G`, `1GiB` (binary units, case-insensitive).
///
/// # Errors
/// Not a number with one of those suffixes, or too large.
pub fn parse(text: &str) -> Result<usize> {
    let trimmed = text.trim();
    let lower = trimmed.to_ascii_lowercase();
    let digits_end = lower.find(|c: char| !c.is_ascii_digit()).unwrap_or(lower.len());
    let (number, unit) = lower.split_at(digits_end);
    let shift = match unit.trim() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        _ => {
            return Err(Error::invalid(
                "size",
                format!("`{trimmed}`: write bytes, or a number with K, KiB, M, MiB, G or GiB"),
            ));
        }
    };
    number
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| Error::invalid("size", format!("`{trimmed}` is not a size hetmem can hold")))
}

/// `4 KiB`, `64 MiB`, `1 GiB`, or plain bytes when not a whole number of KiB.
pub fn format(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 && b.is_multiple_of(1 << 30) => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b.is_multiple_of(1 << 20) => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b.is_multiple_of(1 << 10) => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::{format, log_steps, parse};

    #[test]
    fn steps_are_log_spaced_and_stay_in_range() {
        assert_eq!(log_steps(4096, 1 << 20, 4).unwrap(), [4096, 16384, 65536, 262_144, 1 << 20]);
        assert_eq!(log_steps(4096, 5000, 4).unwrap(), [4096]);
        assert!(log_steps(0, 10, 2).is_err());
        assert!(log_steps(10, 5, 2).is_err());
        assert!(log_steps(1, 5, 1).is_err());
    }

    #[test]
    fn sizes_parse_and_print_in_binary_units() {
        assert_eq!(parse("4096").unwrap(), 4096);
        assert_eq!(parse("4KiB").unwrap(), 4096);
        assert_eq!(parse("64m").unwrap(), 64 << 20);
        assert_eq!(parse("1 GiB").unwrap(), 1 << 30);
        assert!(parse("12 parsecs").unwrap_err().to_string().contains("KiB"));
        assert!(parse("").is_err());
        assert_eq!(format(4096), "4 KiB");
        assert_eq!(format(3 << 20), "3 MiB");
        assert_eq!(format(1 << 30), "1 GiB");
        assert_eq!(format(4), "4 B");
    }
}
