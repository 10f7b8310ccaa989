"""Repository rule that exposes the CUTLASS/CuTe headers to Bazel.

tools/setup.sh unpacks the include/ tree of the pinned nvidia-cutlass wheel
into .deps/cutlass/ (git-ignored); $CUTLASS_PATH, a directory holding
include/cute and include/cutlass, overrides it. The tree is symlinked into
an external repository, so that the headers are declared inputs and nothing
is copied into the source tree or downloaded by the build.
"""

def _local_cutlass_impl(ctx):
    env = ctx.os.environ.get("CUTLASS_PATH", "")
    if env:
        root = ctx.path(env)
    else:
        root = ctx.path(Label("//:WORKSPACE")).dirname.get_child(".deps").get_child("cutlass")
    inc = root.get_child("include")
    if not inc.get_child("cute").get_child("config.hpp").exists:
        fail("CUTLASS headers not found in %s: run tools/setup.sh (or set CUTLASS_PATH)" % inc)
    ctx.symlink(inc, "include")
    ctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % ctx.name)
    ctx.file("BUILD", """# BUILD for the @cutlass repository (tools/build/cutlass_configure.bzl).
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cutlass",
    hdrs = glob(["include/cute/**", "include/cutlass/**"]),
    includes = ["include"],
)
""")

local_cutlass = repository_rule(
    implementation = _local_cutlass_impl,
    environ = ["CUTLASS_PATH"],
    local = True,
)
