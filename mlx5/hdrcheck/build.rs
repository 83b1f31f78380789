//! Compiles `csrc/hdrcheck.c` against rdma-core's installed `<infiniband/mlx5dv.h>` and
//! `<infiniband/verbs.h>`, so that the tests compare the `mlx5` crate with values the C
//! compiler derived from the headers.

use std::path::PathBuf;

const SOURCE: &str = "csrc/hdrcheck.c";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo:rerun-if-env-changed=CFLAGS");

    // First only preprocess a file that includes the two headers: a missing header then gets
    // a message that says what to install, not a wall of compiler errors.
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let probe = out.join("hdrcheck_probe.c");
    std::fs::write(
        &probe,
        "#include <infiniband/verbs.h>\n#include <infiniband/mlx5dv.h>\n",
    )
    .expect("write the header probe into OUT_DIR");
    let expanded = match cc::Build::new()
        .file(&probe)
        .cargo_metadata(false)
        .try_expand()
    {
        Ok(text) => text,
        Err(e) => panic!(
            "\n\nmlx5-hdrcheck: cannot preprocess <infiniband/verbs.h> + <infiniband/mlx5dv.h>.\n\
             These headers come from rdma-core: install libibverbs-dev \
             (Debian/Ubuntu: `apt-get install libibverbs-dev`; Fedora: rdma-core-devel).\n\
             Compiler error: {e}\n"
        ),
    };

    // Rebuild when the headers change: take their real paths from the line markers of the
    // preprocessor output (`# 1 "/usr/include/infiniband/mlx5dv.h" ...`).
    let text = String::from_utf8_lossy(&expanded);
    let mut headers: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with('#'))
        .filter_map(|l| l.split('"').nth(1))
        .filter(|p| p.contains("/infiniband/"))
        .collect();
    headers.sort_unstable();
    headers.dedup();
    for name in ["verbs.h", "mlx5dv.h"] {
        if !headers
            .iter()
            .any(|h| h.ends_with(&format!("/infiniband/{name}")))
        {
            panic!(
                "\n\nmlx5-hdrcheck: <infiniband/{name}> did not come out of the preprocessor; \
                 install libibverbs-dev.\n"
            );
        }
    }
    for h in &headers {
        println!("cargo:rerun-if-changed={h}");
    }

    cc::Build::new()
        .file(SOURCE)
        .std("gnu11")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("hdrcheck");
}
