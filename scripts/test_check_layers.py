#!/usr/bin/env python3
"""Tests of scripts/check_layers.py: each plants one way of naming a higher room (or one thing the
check refuses) in a temporary copy of src/ and docs/ARCHITECTURE.md, and sees the check fail with
a message that names the file and the line. Usage (repo root): python3 scripts/test_check_layers.py
"""
import contextlib
import io
import shutil
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_layers  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# `kernels` is layer 3 and `server` layer 11 (docs/ARCHITECTURE.md): any name of `server` from
# `kernels` is a violation; `gguf` shares the layer of `kernels`, so naming it is one too.
LOW = "src/kernels/mod.rs"


class Tree:
    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="layers-"))
        shutil.copytree(REPO / "src", self.dir / "src")
        (self.dir / "docs").mkdir()
        shutil.copy(REPO / "docs" / "ARCHITECTURE.md", self.dir / "docs")

    def append(self, rel, text):
        path = self.dir / rel
        path.write_text(path.read_text() + "\n" + text + "\n")
        return path.read_text().count("\n") - text.count("\n")  # the first planted line

    def write(self, rel, text):
        path = self.dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def check(self):
        return check_layers.check(self.dir)[0]

    def close(self):
        shutil.rmtree(self.dir)


class CheckLayers(unittest.TestCase):
    def setUp(self):
        self.tree = Tree()

    def tearDown(self):
        self.tree.close()

    def violation(self, text, *expected, rel=LOW):
        """Plants `text` at the end of `rel`; the check must fail, and one message must hold every
        string of `expected` (`{line}` stands for `rel:N` with N a line of the planted text)."""
        first = self.tree.append(rel, text)
        planted = {f"{rel}:{first + k}" for k in range(text.count("\n") + 1)}
        errors = self.tree.check()
        self.assertTrue(errors, f"planted in {rel} and not caught:\n{text}")
        hits = [e for e in errors if all(w in e for w in expected if w != "{line}")]
        if "{line}" in expected:
            hits = [e for e in hits if e.split(": ")[0] in planted]
        self.assertTrue(hits, f"no message holds {expected} ({sorted(planted)}); got:\n"
                        + "\n".join(errors))
        return errors

    def upward(self, text, rel=LOW, target="server"):
        return self.violation(text, "{line}", f"names `{target}`", rel=rel)

    def test_the_real_tree_passes(self):
        self.assertEqual(self.tree.check(), [])
        with contextlib.redirect_stdout(io.StringIO()) as out:
            self.assertEqual(check_layers.main(["--root", str(self.tree.dir)]), 0)
        self.assertIn("layering ok", out.getvalue())

    def test_exit_status(self):
        self.tree.append(LOW, "use crate::server::Server;")
        with contextlib.redirect_stdout(io.StringIO()) as out:
            self.assertEqual(check_layers.main(["--root", str(self.tree.dir)]), 1)
        self.assertIn("1 layering violation(s)", out.getvalue())

    def test_the_uses_list_follows_the_code(self):
        # A legal new arrow (server -> layout) leaves the doc's list behind: refused, then
        # rewritten by --write, after which the check passes.
        self.tree.append("src/server/mod.rs", "use crate::layout::Layout as _Layout;")
        self.assertEqual(self.tree.check(), [])
        with contextlib.redirect_stdout(io.StringIO()) as out:
            self.assertEqual(check_layers.main(["--root", str(self.tree.dir)]), 1)
        self.assertIn("differs from the code", out.getvalue())
        with contextlib.redirect_stdout(io.StringIO()):
            self.assertEqual(check_layers.main(["--root", str(self.tree.dir), "--write"]), 0)
        doc = (self.tree.dir / "docs" / "ARCHITECTURE.md").read_text()
        server = next(l for l in doc.splitlines() if l.split()[1:2] == ["server"])
        self.assertIn("layout", server)
        with contextlib.redirect_stdout(io.StringIO()):
            self.assertEqual(check_layers.main(["--root", str(self.tree.dir)]), 0)

    def test_anyhow_in_the_library(self):
        self.violation("fn f() -> anyhow::Result<()> { Ok(()) }", "{line}", "`anyhow`")

    def test_downward_names_pass(self):
        self.tree.append("src/server/mod.rs", "use crate::kernels::cpu::Isa as _Isa;\n"
                         "fn _f() -> usize { crate::audio::TARGET_RATE as usize }")
        self.assertEqual(self.tree.check(), [])

    def test_use_crate(self):
        self.upward("use crate::server::Server;")

    def test_same_layer(self):
        self.upward("use crate::gguf::GgufFile;", target="gguf")

    def test_super_from_a_top_level_room(self):
        self.upward("use super::server::Server;")

    def test_super_chain_from_a_nested_file(self):
        self.upward("use super::super::server::Server;", rel="src/kernels/linear.rs")

    def test_self_super(self):
        self.upward("use self::super::super::server::Server;", rel="src/kernels/linear.rs")

    def test_super_in_inline_modules(self):
        self.upward("mod t {\n    mod u {\n        use super::super::super::server::X;\n    }\n}")

    def test_nested_groups(self):
        self.upward("use crate::{backend::{self}, server::{openai::{Foo, Bar as Baz}}};")

    def test_group_at_the_root(self):
        self.upward("use {crate::server::X, std::fmt};")

    def test_raw_identifier(self):
        self.upward("use crate::r#server::Server;")

    def test_path_in_an_expression(self):
        self.upward("fn f() -> usize {\n    crate::server::LIMIT + 1\n}")

    def test_path_in_a_type(self):
        self.upward("fn f(_: Vec<crate::server::Job>) {}")

    def test_path_in_a_turbofish_and_a_qualified_path(self):
        self.upward("fn f() { g::<crate::server::Job>(); <crate::server::Job as X>::y(); }")

    def test_path_split_by_comments_and_whitespace(self):
        self.upward("fn f() { crate /* a */ ::\n  // b\n  server :: go() }")

    def test_use_crate_as(self):
        self.upward("use crate as root;\nfn f() { root::server::go() }")

    def test_alias_used_before_it_is_declared(self):
        self.upward("fn f() { root::server::go() }\nuse crate as root;")

    def test_alias_of_an_alias(self):
        self.upward("use crate as a;\nuse a as b;\nfn f() { b::server::go() }")

    def test_use_crate_self_as(self):
        self.upward("use crate::{self as root};\nuse root::server::Server;")

    def test_use_super_as(self):
        self.upward("use super as up;\nfn f() { up::server::go() }")

    def test_extern_crate_self(self):
        self.upward("extern crate self as me;\nfn f() { me::server::go() }")

    def test_extern_crate_self_in_lib(self):
        self.tree.append("src/lib.rs", "extern crate self as parakeet;")
        self.upward("fn f() { parakeet::server::go() }")

    def test_extern_crate_self_in_lib_with_leading_colons(self):
        self.tree.append("src/lib.rs", "extern crate self as parakeet;")
        self.upward("fn f() { ::parakeet::server::go() }")

    def test_public_alias_of_the_root(self):
        self.violation("pub use crate as root;", "{line}", "public alias of the crate root")

    def test_crate_visible_alias_of_the_root(self):
        self.violation("pub(crate) use super as up;", "{line}", "public alias of the crate root")

    def test_glob_of_the_root(self):
        self.violation("use super::*;", "{line}", "glob import of the crate root")

    def test_glob_of_the_root_by_crate(self):
        self.violation("use crate::*;", "{line}", "glob import of the crate root")

    def test_reexport_of_the_root(self):
        self.tree.append("src/lib.rs", "pub use server::Server;")
        self.upward("use crate::Server;")

    def test_reexport_of_the_root_through_super(self):
        self.tree.append("src/lib.rs", "pub use crate::server::{openai::Job as RootJob};")
        self.upward("fn f(_: super::RootJob) {}")

    def test_item_of_the_root(self):
        self.tree.append("src/lib.rs", "pub fn helper() {}")
        self.violation("fn f() { crate::helper() }", "{line}", "an item of the crate root")

    def test_dollar_crate_in_a_macro(self):
        self.upward("macro_rules! m {\n    () => { $crate::server::go() };\n}")

    def test_our_macro_from_a_higher_room(self):
        self.tree.append("src/server/mod.rs", "#[macro_export]\nmacro_rules! upward {\n"
                         "    () => {};\n}")
        self.upward("fn f() { upward!(); }")

    def test_our_exported_macro_by_its_root_path(self):
        self.tree.append("src/server/mod.rs", "#[macro_export]\nmacro_rules! upward2 {\n"
                         "    () => {};\n}")
        self.upward("fn f() { crate::upward2!(); }")

    def test_doc_link(self):
        self.upward("/// Used by [`crate::server::Server`].\nfn f() {}")

    def test_doc_link_with_text(self):
        self.upward("//! See [the server](super::server).")

    def test_block_doc_link(self):
        self.upward("/** See [`super::server::Server`]. */\nfn f() {}")

    def test_path_in_an_attribute(self):
        self.upward("#[derive(crate::server::Derive)]\nstruct S;")

    def test_path_string_in_an_attribute(self):
        self.upward('#[serde(with = "crate::server::codec")]\nstruct S;')

    def test_path_attribute(self):
        self.violation('#[path = "../server/mod.rs"]\nmod srv;', "{line}", "#[path]")

    def test_path_attribute_in_cfg_attr(self):
        self.violation('#[cfg_attr(unix, path = "../server/mod.rs")]\nmod srv2;', "{line}",
                       "#[path]")

    def test_include(self):
        self.violation('include!("../server/realtime.rs");', "{line}", "include!")

    def test_module_declared_by_a_macro(self):
        self.violation("macro_rules! m {\n    ($n:ident) => { mod $n; };\n}", "mod $name")

    def test_file_no_mod_reaches(self):
        self.tree.write("src/kernels/orphan.rs", "use crate::server::Server;\n")
        self.violation("", "src/kernels/orphan.rs", "no `mod` declaration reaches")

    def test_room_missing_from_the_table(self):
        self.tree.write("src/extra.rs", "pub fn f() {}\n")
        self.violation("pub mod extra;", "src/extra", "not in the layers table", rel="src/lib.rs")

    def test_cycle_inside_a_room(self):
        self.tree.append("src/audio/mel.rs", "use super::resample::Resampler as _R;")
        self.violation("fn _g() { let _ = crate::audio::mel::N_FFT; }", "import cycle",
                       "audio::mel", "audio::resample", rel="src/audio/resample.rs")

    def test_room_over_the_share(self):
        self.violation("// filler\n" * 40000, "src/kernels", "more than 40%")

    def test_comments_strings_and_chars_do_not_count(self):
        self.tree.append(LOW, "\n".join([
            "// crate::server::X",
            "/* outer /* crate::server::Y */ still a comment: crate::server::Z */",
            "const _Q: char = '\"';",
            "const _S: &str = \"crate::server::X // not a comment\";",
            "const _R: &str = r#\"crate::server \"quoted\" \"#;",
            "const _B: &[u8] = b\"super::server\";",
            "fn _life<'a>(x: &'a str) -> &'a str { x }",
            "const _E: char = '\\'';",
            "//// four slashes: crate::server::[`crate::server::X`], not a doc comment",
        ]))
        self.assertEqual(self.tree.check(), [])

    def test_precise_capture_is_not_a_use(self):
        self.tree.append(LOW, "fn _f<'a>(x: &'a [u8]) -> impl Iterator<Item = &'a u8> + use<'a> "
                         "{ x.iter() }")
        self.assertEqual(self.tree.check(), [])


if __name__ == "__main__":
    unittest.main(verbosity=1)
