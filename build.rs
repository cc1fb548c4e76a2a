//! Finds which client toolchains the integration tests can use, so that a test whose toolchain is
//! missing is reported as ignored, with what to install, instead of passing without running.
//!
//! For each missing toolchain this emits `cfg(missing_toolchain = "<name>")`; the tests of
//! `tests/integration/clients.rs` and `tools_*.rs` carry
//! `#[cfg_attr(missing_toolchain = "<name>", ignore = "needs …: run bash .ci/setup-…")]`, so that
//! `cargo test` counts them as ignored and says why on each line. With `CI=true` (or `1`) nothing
//! is emitted: CI installs every toolchain first (`.ci/run`), and a missing one must fail its test
//! there, which the tests' own checks then do.
//!
//! A toolchain is present when what its setup leaves is there: the stamp file its setup script
//! writes last (`.pgdp-requirements`, `.pgdp-lock`), and for the system packages the programs,
//! the jar and the registered ODBC driver that the tests use. The library itself reads none of
//! this.
//!
//! Rebuilds. Any rerun of a build script makes cargo rebuild the whole crate, so this script
//! watches as little as it can: the files it found (so that deleting a venv or a stamp reruns it)
//! and `CI` only while something is missing (with everything present, `CI` changes nothing).
//! Cargo cannot watch a file that does not exist yet (it would rerun on every build), so the
//! `.ci/setup-*` scripts `touch build.rs` when they have installed something.

use std::path::{Path, PathBuf};

/// One toolchain of the integration tests: its `cfg` value and the paths that show it is there.
struct Toolchain {
    name: &'static str,
    /// Files in the source tree, relative to the manifest directory.
    files: &'static [&'static str],
    /// Absolute paths of system files.
    system_files: &'static [&'static str],
    /// Programs that must be on `PATH`.
    programs: &'static [&'static str],
    /// A file that must contain a line (the ODBC driver's section in odbcinst.ini).
    line_in: Option<(&'static str, &'static str)>,
}

/// Kept in step with the paths the tests check at run time (`tests/integration/clients.rs`,
/// `tools_*.rs`) and the stamps the setup scripts write.
const TOOLCHAINS: &[Toolchain] = &[
    // .ci/setup-clients: tests/clients/.venv from tests/clients/requirements.txt.
    Toolchain {
        name: "clients-python",
        files: &[
            "tests/clients/.venv/.pgdp-requirements",
            "tests/clients/.venv/bin/python",
        ],
        system_files: &[],
        programs: &[],
        line_in: None,
    },
    // .ci/setup-clients: node-postgres in tests/clients/node_modules.
    Toolchain {
        name: "clients-node",
        files: &["tests/clients/node_modules/.pgdp-lock"],
        system_files: &[],
        programs: &["node"],
        line_in: None,
    },
    // .ci/setup-clients: Debian's libpostgresql-jdbc-java and a JDK.
    Toolchain {
        name: "jdbc",
        files: &[],
        system_files: &["/usr/share/java/postgresql.jar"],
        programs: &["javac", "java"],
        line_in: None,
    },
    // .ci/setup-clients: Debian's odbc-postgresql, registered with unixodbc (isql).
    Toolchain {
        name: "odbc",
        files: &[],
        system_files: &[],
        programs: &["isql"],
        line_in: Some(("/etc/odbcinst.ini", "[PostgreSQL Unicode]")),
    },
    // .ci/setup-node-tools: Sequelize, Knex and Prisma Client in tests/tools/node/node_modules.
    Toolchain {
        name: "tools-node",
        files: &["tests/tools/node/node_modules/.pgdp-lock"],
        system_files: &[],
        programs: &["node"],
        line_in: None,
    },
    // .ci/setup-python-tools: Django and pgcli in tests/tools/python/.venv.
    Toolchain {
        name: "tools-python",
        files: &[
            "tests/tools/python/.venv/.pgdp-requirements",
            "tests/tools/python/.venv/bin/python",
        ],
        system_files: &[],
        programs: &[],
        line_in: None,
    },
    // .ci/setup-superset: Apache Superset and its metadata template in tests/tools/superset/.venv.
    Toolchain {
        name: "superset",
        files: &[
            "tests/tools/superset/.venv/.pgdp-requirements",
            "tests/tools/superset/.venv/pgdp-superset-metadata.sqlite",
        ],
        system_files: &[],
        programs: &[],
        line_in: None,
    },
];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let names: Vec<String> = TOOLCHAINS
        .iter()
        .map(|t| format!("\"{}\"", t.name))
        .collect();
    println!(
        "cargo::rustc-check-cfg=cfg(missing_toolchain, values({}))",
        names.join(", ")
    );

    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let mut watched = Vec::new();
    let missing: Vec<&str> = TOOLCHAINS
        .iter()
        .filter(|toolchain| !present(toolchain, &manifest_dir, &mut watched))
        .map(|toolchain| toolchain.name)
        .collect();
    watched.sort();
    watched.dedup();
    for path in &watched {
        println!("cargo::rerun-if-changed={}", path.display());
    }
    if missing.is_empty() {
        return;
    }
    // Only now does CI change the output.
    println!("cargo::rerun-if-env-changed=CI");
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    if in_ci {
        return;
    }
    for name in missing {
        println!("cargo::rustc-cfg=missing_toolchain=\"{name}\"");
    }
}

/// Whether every file, program and line of `toolchain` is there; the files found are added to
/// `watched`.
fn present(toolchain: &Toolchain, manifest_dir: &Path, watched: &mut Vec<PathBuf>) -> bool {
    let mut all = true;
    let files = toolchain.files.iter().map(|f| manifest_dir.join(f));
    let system_files = toolchain.system_files.iter().map(PathBuf::from);
    let programs = toolchain.programs.iter().map(|p| on_path(p));
    let line_file = toolchain.line_in.map(|(file, _)| Some(PathBuf::from(file)));
    for path in files
        .chain(system_files)
        .map(Some)
        .chain(programs)
        .chain(line_file)
    {
        match path {
            Some(path) if path.is_file() => watched.push(path),
            _ => all = false,
        }
    }
    if let Some((file, line)) = toolchain.line_in {
        let found =
            std::fs::read_to_string(file).is_ok_and(|text| text.lines().any(|l| l.trim() == line));
        all &= found;
    }
    all
}

/// Where `program` is on `PATH`, as the tests look for it.
fn on_path(program: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
}
