//! hetmem's promises proven by code that must not compile: the hand-off's (who may touch a
//! buffer when), and the size types' (a shape or format a kernel trusts comes from its checked
//! constructor).

#[test]
fn misuse_does_not_compile() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
