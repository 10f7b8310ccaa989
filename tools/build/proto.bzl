"""grpc_cc_proto_library: C++ messages and gRPC stubs from .proto files.

Calls the system `protoc` and `grpc_cpp_plugin` (Debian's protobuf-compiler and
protobuf-compiler-grpc), so no protobuf toolchain is downloaded. The package
that declares the rule is the proto root: `import "recfleet/v1/x.proto"` in a
file under proto/recfleet/v1/ resolves when the rule lives in proto/BUILD.
"""

_EXTS = [".pb.h", ".pb.cc", ".grpc.pb.h", ".grpc.pb.cc"]

def _gen_impl(ctx):
    root = ctx.label.package
    outs = ctx.outputs.outs
    out_root = ctx.bin_dir.path + ("/" + root if root else "")
    cmd = " ".join([
        "protoc",
        "-I" + (root if root else "."),
        "--cpp_out=" + out_root,
        "--grpc_out=" + out_root,
        "--plugin=protoc-gen-grpc=$(command -v grpc_cpp_plugin)",
    ] + [s.path for s in ctx.files.srcs])
    ctx.actions.run_shell(
        command = cmd,
        # Imported .proto files of `deps` are read by protoc too.
        inputs = ctx.files.srcs + ctx.files.deps,
        outputs = outs,
        mnemonic = "Protoc",
        progress_message = "protoc %s" % ctx.label,
        use_default_shell_env = True,
    )
    return [DefaultInfo(files = depset(outs))]

_grpc_proto_gen = rule(
    implementation = _gen_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".proto"]),
        "deps": attr.label_list(allow_files = [".proto"]),
        # Predeclared so that the cc_library below can name the files.
        "outs": attr.output_list(),
    },
)

def grpc_cc_proto_library(name, srcs, deps = [], visibility = None):
    """One cc_library with the messages and services of `srcs`.

    `deps` are other grpc_cc_proto_library targets whose files `srcs` import.
    """
    hdrs = []
    cc_srcs = []
    for s in srcs:
        base = s[:-len(".proto")]
        hdrs += [base + ".pb.h", base + ".grpc.pb.h"]
        cc_srcs += [base + ".pb.cc", base + ".grpc.pb.cc"]
    _grpc_proto_gen(
        name = name + "_gen",
        srcs = srcs,
        deps = [d + "_files" for d in deps],
        outs = [s[:-len(".proto")] + e for s in srcs for e in _EXTS],
    )
    native.filegroup(name = name + "_files", srcs = srcs, visibility = visibility)
    native.cc_library(
        name = name,
        srcs = cc_srcs,
        hdrs = hdrs,
        includes = ["."],
        copts = ["-Wno-unused-parameter"],
        deps = deps + ["//third_party:grpc", "//third_party:protobuf"],
        visibility = visibility,
    )
