//! The uverbs and mlx5 ABI structs, generated from the uapi headers the build installs
//! (`libibverbs-dev` ships `/usr/include/rdma`): the layouts are the kernel's own.

fn main() {
    println!("cargo:rerun-if-changed=src/abi.h");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    bindgen::Builder::default()
        .header("src/abi.h")
        .allowlist_type("ib_uverbs_.*")
        .allowlist_type("mlx5_.*")
        .allowlist_var("IB_USER_VERBS_.*")
        .allowlist_var("MLX5_.*")
        .allowlist_type("ib_uverbs_write_cmds")
        .allowlist_type("ib_uverbs_ex_write_cmds")
        .derive_default(true)
        .layout_tests(false)
        .prepend_enum_name(false)
        .generate()
        .expect("bindgen over <rdma/ib_user_verbs.h> and <rdma/mlx5-abi.h>")
        .write_to_file(out.join("abi.rs"))
        .expect("write abi.rs");
}
