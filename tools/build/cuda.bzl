"""cuda_library: compiles .cu sources with nvcc for sm_90a.

The result is an ordinary cc_library that any cc target can depend on. Every
CUDA source builds on every machine (nvcc needs no GPU); tests that need a GPU
to run carry the `gpu` tag.
"""

def _nvcc_objects_impl(ctx):
    hdrs = depset(
        ctx.files.hdrs,
        transitive = [d[CcInfo].compilation_context.headers for d in ctx.attr.deps],
    )
    inc_dirs = ["-I."]
    for d in ctx.attr.deps:
        cc = d[CcInfo].compilation_context
        for p in cc.includes.to_list() + cc.system_includes.to_list() + cc.quote_includes.to_list():
            inc_dirs.append("-I" + p)
    for root in [ctx.bin_dir.path, ctx.genfiles_dir.path]:
        inc_dirs.append("-I" + root)
    outs = []
    for src in ctx.files.srcs:
        obj = ctx.actions.declare_file("_nvcc/%s/%s.pic.o" % (ctx.label.name, src.basename[:-len(".cu")]))
        args = [ctx.executable._nvcc.path, obj.path, src.path] + inc_dirs + ctx.attr.copts
        ctx.actions.run(
            executable = ctx.executable._script,
            arguments = args,
            inputs = depset([src], transitive = [hdrs]),
            tools = [ctx.executable._nvcc] + ctx.files._cuda_headers,
            outputs = [obj],
            mnemonic = "Nvcc",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
        outs.append(obj)
    return [DefaultInfo(files = depset(outs))]

_nvcc_objects = rule(
    implementation = _nvcc_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "_nvcc": attr.label(default = "@local_cuda//:nvcc", executable = True, cfg = "host", allow_single_file = True),
        "_script": attr.label(default = "//tools/build:nvcc_compile.sh", executable = True, cfg = "host", allow_single_file = True),
        "_cuda_headers": attr.label(default = "@local_cuda//:cuda_header_files"),
    },
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], visibility = None, **kwargs):
    """A cc_library whose .cu sources are compiled by nvcc for sm_90a."""
    _nvcc_objects(
        name = name + "_nvcc",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cuda_headers"],
        copts = copts,
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_nvcc"],
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        alwayslink = True,
        # The CUDA runtime is linked statically (@local_cuda//:cudart), so the
        # nvcc objects must land in the final binary next to it rather than in
        # a shared object of their own that could not resolve its symbols.
        linkstatic = True,
        visibility = visibility,
        **kwargs
    )
