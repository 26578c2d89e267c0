// The one C++ frame between the node's Rust code and the C entry points of the PJRT plugin
// (and of native kernels): it calls an entry point and catches any C++ exception it throws.
//
// XLA's C API functions are meant to report failures as error values, but some of XLA's C++
// code throws (an absl::StatusOr read without checking it, as when the CPU compiler builds a
// copy of 2- or 4-bit integers). An exception unwinding into Rust frames aborts the whole
// process, so every such call goes through `xla_node_call_catching`, which stops the
// exception here and hands back its type and `what()` text instead. Built by build.rs (the
// `cc` crate); its Rust side is src/xla/catch.rs.

#include <cxxabi.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <typeinfo>

namespace {

// The demangled name of `type` (its mangled name if it cannot be demangled), into `out`.
void describe_type(const std::type_info* type, char* out, std::size_t out_size) {
    if (type == nullptr) {
        std::snprintf(out, out_size, "an exception of unknown type");
        return;
    }
    int status = 0;
    char* name = abi::__cxa_demangle(type->name(), nullptr, nullptr, &status);
    std::snprintf(out, out_size, "%s", status == 0 && name != nullptr ? name : type->name());
    std::free(name);
}

}  // namespace

// Calls `entry(args)`. Returns 0 when it returned, with its result in `*result`; returns 1 when
// it threw, with "<exception type>: <what()>" (or the type alone for an exception that is not a
// std::exception) in `what`, NUL-terminated and cut to `what_size` bytes; `*result` is then
// untouched.
extern "C" int xla_node_call_catching(void* (*entry)(void*), void* args, void** result,
                                      char* what, std::size_t what_size) {
    try {
        *result = entry(args);
        return 0;
    } catch (abi::__forced_unwind&) {
        // Thread cancellation must go on unwinding (the node cancels no threads).
        throw;
    } catch (const std::exception& e) {
        char type[256];
        describe_type(abi::__cxa_current_exception_type(), type, sizeof type);
        std::snprintf(what, what_size, "%s: %s", type, e.what());
    } catch (...) {
        describe_type(abi::__cxa_current_exception_type(), what, what_size);
    }
    return 1;
}
