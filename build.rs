//! Generates the libibverbs bindings from the system's headers with a current bindgen.
//!
//! Only the functions and types `src/verbs/rdma/` uses are generated (the allowlist
//! below pulls in what they depend on). Masks are newtypes (`ibv_qp_attr_mask(u32)`,
//! combined with `|`, passed as `.0`); value enums are modules of constants
//! (`ibv_qp_type::IBV_QPT_UD`, type `ibv_qp_type::Type`); `ibv_event_type` is a Rust
//! enum. The static-inline verbs of `<infiniband/verbs.h>` (`ibv_poll_cq`,
//! `ibv_post_send`, ...) have no symbol to bind: `src/verbs/rdma/ffi.rs` writes them.
//!
//! libclang is found by clang-sys: `LIBCLANG_PATH` if set, otherwise the newest installed
//! (Debian: `libclang1-N`; 14 and 19 are both tested). docs/BUILD.md says why this and not
//! rdma-sys.
use std::env;
use std::path::PathBuf;

const FUNCTIONS: &[&str] = &[
    "ibv_get_device_list",
    "ibv_free_device_list",
    "ibv_get_device_name",
    "ibv_get_device_guid",
    "ibv_get_device_index",
    "ibv_open_device",
    "ibv_close_device",
    "ibv_query_port",
    "_ibv_query_gid_ex",
    "ibv_alloc_pd",
    "ibv_dealloc_pd",
    "ibv_reg_mr",
    "ibv_dereg_mr",
    "ibv_create_comp_channel",
    "ibv_destroy_comp_channel",
    "ibv_create_cq",
    "ibv_destroy_cq",
    "ibv_get_cq_event",
    "ibv_ack_cq_events",
    "ibv_create_qp",
    "ibv_modify_qp",
    "ibv_destroy_qp",
    "ibv_create_ah",
    "ibv_destroy_ah",
    "ibv_attach_mcast",
    "ibv_detach_mcast",
    "ibv_get_async_event",
    "ibv_ack_async_event",
];

const TYPES: &[&str] = &[
    "ibv_context",
    "verbs_context",
    "ibv_device",
    "ibv_port_attr",
    "ibv_gid",
    "ibv_gid_entry",
    "ibv_pd",
    "ibv_mr",
    "ibv_comp_channel",
    "ibv_cq",
    "ibv_qp",
    "ibv_qp_init_attr",
    "ibv_qp_attr",
    "ibv_ah",
    "ibv_ah_attr",
    "ibv_sge",
    "ibv_send_wr",
    "ibv_recv_wr",
    "ibv_wc",
    "ibv_async_event",
];

/// Flag sets: newtypes with `|`.
const BITFIELDS: &[&str] = &[
    "ibv_access_flags",
    "ibv_qp_attr_mask",
    "ibv_send_flags",
    "ibv_wc_flags",
];

/// Value sets: modules of constants.
const CONSTANTS: &[&str] = &[
    "ibv_mtu",
    "ibv_gid_type",
    "ibv_port_state",
    "ibv_qp_type",
    "ibv_qp_state",
    "ibv_wc_status",
    "ibv_wc_opcode",
    "ibv_wr_opcode",
    "ibv_node_type",
    "ibv_transport_type",
    "ibv_mig_state",
    "rdma_cm_event_type",
    "rdma_port_space",
];

fn main() {
    println!("cargo:rerun-if-changed=build/verbs.h");
    println!("cargo:rerun-if-changed=build.rs");
    // Which libclang parses the header (clang-sys reads it too; said here so the
    // bindings and libclang-version are redone when it changes).
    println!("cargo:rerun-if-env-changed=LIBCLANG_PATH");

    let ibverbs = match pkg_config::Config::new()
        // 1.11 (rdma-core 32): `_ibv_query_gid_ex`.
        .atleast_version("1.11.32")
        .probe("libibverbs")
    {
        Ok(lib) => lib,
        Err(e) => fail(&format!(
            "libibverbs not found by pkg-config ({e}); on Debian or Ubuntu install \
             libibverbs-dev and pkg-config (README: Building)"
        )),
    };
    let mut includes: Vec<PathBuf> = ibverbs.include_paths.clone();
    if let Ok(cm) = pkg_config::Config::new()
        .cargo_metadata(false)
        .probe("librdmacm")
    {
        includes.extend(cm.include_paths);
    }

    let mut builder = bindgen::Builder::default()
        .header("build/verbs.h")
        .clang_args(includes.iter().map(|p| format!("-I{}", p.display())))
        .clang_args(
            fallback_builtin_headers()
                .iter()
                .map(|p| format!("-idirafter{}", p.display())),
        )
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .derive_copy(true)
        .derive_debug(false)
        .derive_default(false)
        .generate_comments(false)
        .layout_tests(true)
        .prepend_enum_name(false)
        .opaque_type("pthread_.*")
        .rustified_enum("ibv_event_type");
    for f in FUNCTIONS {
        builder = builder.allowlist_function(f);
    }
    for t in TYPES.iter().chain(BITFIELDS).chain(CONSTANTS) {
        builder = builder.allowlist_type(t);
    }
    for t in BITFIELDS {
        builder = builder.bitfield_enum(t);
    }
    for t in CONSTANTS {
        builder = builder.constified_enum_module(t);
    }
    let bindings = match builder.generate() {
        Ok(b) => b,
        Err(e) => fail(&format!(
            "bindgen could not read <infiniband/verbs.h> ({e}); it needs libclang \
             (Debian: libclang1-14 or later; `LIBCLANG_PATH` picks one), a C compiler's \
             own headers (gcc, or libclang-common-N-dev) and libibverbs-dev (README: \
             Building)"
        )),
    };
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    if let Err(e) = bindings.write_to_file(out.join("verbs.rs")) {
        fail(&format!(
            "writing the verbs bindings to {}: {e}",
            out.display()
        ));
    }
    // Which libclang made them, for `scripts/test` (it builds with 14 and with 19).
    let version = out.join("libclang-version");
    if let Err(e) = std::fs::write(&version, format!("{}\n", bindgen::clang_version().full)) {
        fail(&format!("writing {}: {e}", version.display()));
    }
}

/// Directories holding the compiler's own headers (`stddef.h`, `stdarg.h`), searched
/// after everything else. libclang looks for them in its resource directory, which
/// Debian ships apart (`libclang-common-N-dev`): with `libclang1-19` installed but not
/// `libclang-common-19-dev`, clang-sys picks libclang 19 and it finds no `stddef.h`. Then
/// another installed clang's resource headers, or gcc's, stand in (they define the same
/// C types).
fn fallback_builtin_headers() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut clangs: Vec<PathBuf> = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("llvm-"))
        })
        .flat_map(|llvm| {
            std::fs::read_dir(llvm.join("lib/clang"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path().join("include"))
        })
        .filter(|inc| inc.join("stddef.h").is_file())
        .collect();
    clangs.sort();
    dirs.extend(clangs.into_iter().rev());
    let cc = env::var("CC").unwrap_or_else(|_| "cc".into());
    if let Ok(out) = std::process::Command::new(cc)
        .arg("-print-file-name=include")
        .output()
        && out.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("stddef.h").is_file() {
            dirs.push(dir);
        }
    }
    dirs
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1);
}
