"""Repository rule that exposes the installed CUDA toolkit to Bazel.

The toolkit is located through $CUDA_PATH, else the directory of `nvcc` on
PATH, else /usr/local/cuda. Its include/ and lib64/ trees are symlinked into
an external repository so that headers are declared inputs (Bazel's include
checker accepts them) and libraries are found without absolute paths in BUILD
files.
"""

def _find_cuda(ctx):
    env = ctx.os.environ.get("CUDA_PATH", "")
    if env:
        return ctx.path(env)
    nvcc = ctx.which("nvcc")
    if nvcc:
        return nvcc.dirname.dirname
    return ctx.path("/usr/local/cuda")

def _local_cuda_impl(ctx):
    root = _find_cuda(ctx)
    if not root.get_child("bin").get_child("nvcc").exists:
        fail("CUDA toolkit not found: set CUDA_PATH or put nvcc on PATH (looked in %s)" % root)
    ctx.symlink(root.get_child("include"), "include")
    ctx.symlink(root.get_child("lib64"), "lib64")
    # nvcc finds its companions (cicc, ptxas) relative to its own real path,
    # so the repository holds a forwarding script rather than a symlink.
    ctx.file("nvcc", "#!/bin/sh\nexec \"%s\" \"$@\"\n" % root.get_child("bin").get_child("nvcc"), executable = True)
    ctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % ctx.name)
    ctx.file("BUILD", ctx.read(ctx.attr._build_tpl))

local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    environ = ["CUDA_PATH", "PATH"],
    local = True,
    attrs = {"_build_tpl": attr.label(default = "//third_party:cuda.BUILD")},
)
