//! Builds rdma-core's own mlx5 send, SRQ and address-handle code (`providers/mlx5/qp.c`,
//! `srq.c`, `verbs.c`, unchanged) from the source tree named by `BLUEFLAME_RDMA_CORE_SRC`,
//! with `csrc/oracle.c` (a memory-backed QP, SRQ and address handle driven through that code)
//! and `csrc/stubs.c` (the few functions of other rdma-core files they reach; see its
//! comment for why verbs.c links without the rest of libibverbs).
//!
//! The tree is rdma-core v55 as the `ibverbs-sys = "=0.3.2+55.0"` crate vendors it; `cargo
//! xtask test` fetches that crate with `cargo fetch` (never builds it) and sets the variable.
//! Without the variable nothing is built and the tests say how to get the source (they fail
//! under `cargo xtask test`, which sets `BLUEFLAME_ORACLE_REQUIRED`).
//!
//! What rdma-core's CMake would have done, done here instead:
//! - `config.h`: the hand-written `csrc/config.h` (see its comment);
//! - the published headers: `libibverbs/*.h` and the mlx5 direct-verbs headers copied to
//!   `OUT_DIR/include/infiniband/`, `kernel-headers/` on the include path (as `rdma/`,
//!   `linux/`);
//! - `kernel-abi/*.h`: generated from `kernel-headers/rdma/*.h` by the rules of
//!   `buildlib/make_abi_structs.py`, ported below ([`abi_structs`]).

use std::path::{Path, PathBuf};

const ENV: &str = "BLUEFLAME_RDMA_CORE_SRC";
/// The rdma-core release the oracle is written against (`oracle.c` sets up its structs).
const VERSION: &str = "55.0";

/// `libibverbs` headers rdma-core publishes as `<infiniband/...>`.
const VERBS_HEADERS: &[&str] = &[
    "arch.h",
    "opcode.h",
    "sa-kern-abi.h",
    "sa.h",
    "verbs.h",
    "verbs_api.h",
    "tm_types.h",
    "cmd_ioctl.h",
    "cmd_write.h",
    "driver.h",
    "kern-abi.h",
    "marshall.h",
];
/// Other files published as `<infiniband/...>` (providers/mlx5/CMakeLists.txt,
/// kernel-headers/CMakeLists.txt).
const OTHER_PUBLISHED: &[&str] = &[
    "providers/mlx5/mlx5_api.h",
    "providers/mlx5/mlx5dv.h",
    "kernel-headers/rdma/mlx5_user_ioctl_verbs.h",
    "kernel-headers/rdma/ib_user_ioctl_verbs.h",
];
/// Kernel ABI headers the two files reach (through driver.h and mlx5-abi.h).
const KERNEL_ABI: &[&str] = &["ib_user_verbs.h", "mlx5-abi.h"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-env-changed={ENV}");
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo:rerun-if-env-changed=CFLAGS");
    println!("cargo:rustc-check-cfg=cfg(rdma_core_oracle)");

    let Some(src) = std::env::var_os(ENV) else {
        println!(
            "cargo:warning=mlx5-oracle: {ENV} is not set: rdma-core's provider is not built and \
             the oracle tests will skip (cargo xtask test sets it)"
        );
        return;
    };
    let root = PathBuf::from(src);
    let qp_c = root.join("providers/mlx5/qp.c");
    if !qp_c.is_file() {
        panic!(
            "\n\nmlx5-oracle: {ENV}={} is not an rdma-core source tree (no providers/mlx5/qp.c).\n\
             cargo xtask test fetches it (tools/oracle-src) and sets {ENV} itself.\n",
            root.display()
        );
    }
    let cmake = std::fs::read_to_string(root.join("CMakeLists.txt")).unwrap_or_default();
    let want = format!("set(PACKAGE_VERSION \"{VERSION}\")");
    if !cmake.contains(&want) {
        panic!(
            "\n\nmlx5-oracle: {} is not rdma-core {VERSION} (its CMakeLists.txt has no `{want}`); \
             csrc/oracle.c sets up rdma-core {VERSION}'s structs.\n",
            root.display()
        );
    }

    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let inc = out.join("include");
    let ib = inc.join("infiniband");
    let kabi = inc.join("kernel-abi");
    std::fs::create_dir_all(&ib).expect("create OUT_DIR/include/infiniband");
    std::fs::create_dir_all(&kabi).expect("create OUT_DIR/include/kernel-abi");
    let copy = |from: &Path, to: &Path| {
        println!("cargo:rerun-if-changed={}", from.display());
        std::fs::copy(from, to)
            .unwrap_or_else(|e| panic!("copy {} -> {}: {e}", from.display(), to.display()));
    };
    for h in VERBS_HEADERS {
        copy(&root.join("libibverbs").join(h), &ib.join(h));
    }
    for p in OTHER_PUBLISHED {
        let from = root.join(p);
        copy(&from, &ib.join(from.file_name().expect("a file name")));
    }
    for h in KERNEL_ABI {
        let from = root.join("kernel-headers/rdma").join(h);
        println!("cargo:rerun-if-changed={}", from.display());
        let text = std::fs::read_to_string(&from)
            .unwrap_or_else(|e| panic!("read {}: {e}", from.display()));
        std::fs::write(kabi.join(h), abi_structs(&text)).expect("write a kernel-abi header");
    }
    copy(Path::new("csrc/config.h"), &inc.join("config.h"));

    let mlx5 = root.join("providers/mlx5");
    let includes = [
        inc.clone(),
        root.clone(),
        root.join("kernel-headers"),
        mlx5.clone(),
        PathBuf::from("csrc"),
    ];

    // rdma-core's two files, unchanged, with rdma-core's own language settings.
    let mut rc = cc::Build::new();
    rc.std("gnu11")
        .define("_GNU_SOURCE", None)
        .includes(&includes)
        .warnings(false)
        .file(&qp_c)
        .file(mlx5.join("srq.c"))
        .file(mlx5.join("verbs.c"));
    rc.compile("mlx5_oracle_rdma_core");

    // The oracle's own C: warnings are errors.
    let mut own = cc::Build::new();
    own.std("gnu11")
        .define("_GNU_SOURCE", None)
        .includes(&includes)
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-missing-field-initializers")
        .flag_if_supported("-Wno-sign-compare")
        .file("csrc/oracle.c")
        .file("csrc/stubs.c");
    own.compile("mlx5_oracle");

    println!("cargo:rustc-cfg=rdma_core_oracle");
    println!("cargo:rustc-env=MLX5_ORACLE_RDMA_CORE={}", root.display());
}

/// `buildlib/make_abi_structs.py`: every top-level `struct x { ... };` of a kernel header
/// becomes `#define _STRUCT_x struct { ... }` (one logical line), so that rdma-core's wrapper
/// structs can embed the kernel's members. Comments on a line are dropped first, as the
/// script does.
fn abi_structs(text: &str) -> String {
    enum State {
        Find,
        In(u32),
    }
    let mut out = String::new();
    let mut state = State::Find;
    for raw in text.lines() {
        let mut ln = raw.trim().to_owned();
        // re.sub(r"/\*.*\*/", "", ln): from the first "/*" to the last "*/" of the line.
        if let (Some(a), Some(b)) = (ln.find("/*"), ln.rfind("*/")) {
            if b >= a + 2 {
                ln.replace_range(a..b + 2, "");
            }
        }
        // re.sub(r"//.*$", "", ln)
        if let Some(a) = ln.find("//") {
            ln.truncate(a);
        }
        state = match state {
            State::Find => {
                let kind = ["struct ", "union "]
                    .into_iter()
                    .find(|k| ln.starts_with(k));
                match kind {
                    Some(k) => {
                        // (struct|union)\s+(\S+)\s+{
                        let rest = ln[k.len()..].trim_start();
                        let name: String =
                            rest.chars().take_while(|c| !c.is_whitespace()).collect();
                        let after = rest[name.len()..].trim_start();
                        if name.is_empty() || !after.starts_with('{') {
                            State::Find
                        } else {
                            out.push_str(&format!(
                                "#define _STRUCT_{name} {} {{ \\\n",
                                k.trim_end()
                            ));
                            State::In(0)
                        }
                    }
                    None => State::Find,
                }
            }
            State::In(nesting) => {
                let closes = ln.starts_with('}') && ln[1..].contains(';');
                if nesting == 0 && closes {
                    // FO.write(ln[:-1] + "\n\n")
                    let mut s = ln.clone();
                    s.pop();
                    out.push_str(&s);
                    out.push_str("\n\n");
                    State::Find
                } else {
                    out.push_str(&ln);
                    out.push_str(" \\\n");
                    if ln == "struct {" || ln == "union {" {
                        State::In(nesting + 1)
                    } else if closes {
                        State::In(nesting.saturating_sub(1))
                    } else {
                        State::In(nesting)
                    }
                }
            }
        };
    }
    out
}
