//! What the machine offers the random-read cells' page sizes: transparent huge pages (2 MiB,
//! what `random_read_2m_pages` asks for with `madvise`) and reserved 1 GiB hugetlbfs pages.

/// Where Linux says how many 1 GiB pages are reserved.
const GIANT_PAGES: &str = "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages";
/// Where Linux says when transparent huge pages are used.
const TRANSPARENT: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// The page sizes behind the random-read cells, in words: the transparent huge page setting
/// (`random_read_2m_pages` runs on base pages where it is `never`), and why 1 GiB pages were
/// not measured.
pub fn page_sizes() -> String {
    let transparent = std::fs::read_to_string(TRANSPARENT)
        .ok()
        .and_then(|setting| selected(&setting).map(str::to_string))
        .unwrap_or_else(|| format!("unknown ({TRANSPARENT} unreadable)"));
    let giant = match std::fs::read_to_string(GIANT_PAGES)
        .ok()
        .and_then(|count| count.trim().parse::<u64>().ok())
    {
        None => format!("not measured: this kernel offers no 1 GiB pages ({GIANT_PAGES} is absent)"),
        Some(0) => format!(
            "not measured: none are reserved here ({GIANT_PAGES} is 0; as root, reserve them at boot with \
             hugepagesz=1G hugepages=N)"
        ),
        Some(count) => format!(
            "not measured: {count} are reserved here, but hetmem allocates no hugetlbfs memory (only transparent \
             huge pages)"
        ),
    };
    format!("transparent huge pages: {transparent}; 1 GiB pages: {giant}")
}

/// The setting in brackets of a sysfs choice such as `always [madvise] never`.
fn selected(setting: &str) -> Option<&str> {
    let start = setting.find('[')? + 1;
    let end = start + setting[start..].find(']')?;
    Some(&setting[start..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bracketed_choice_is_the_setting() {
        assert_eq!(selected("always [madvise] never\n"), Some("madvise"));
        assert_eq!(selected("[always] madvise never"), Some("always"));
        assert_eq!(selected("always madvise never"), None);
    }

    #[test]
    fn the_words_name_both_page_sizes() {
        let words = page_sizes();
        assert!(
            words.starts_with("transparent huge pages: ") && words.contains("; 1 GiB pages: not measured: "),
            "{words}"
        );
    }
}
