//! The hand-off's promises, proven by code that must not compile.

#[test]
fn handoff_misuse_does_not_compile() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
