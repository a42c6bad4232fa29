import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// glibc settings that keep secrets out of freed heap memory, applied by re-executing the
/// program once with them (glibc reads `GLIBC_TUNABLES` only at start): keybagd (class keys),
/// and the file system servers — `dpctl mount`, the apps' server — whose buffers carry
/// plaintext.
///
/// Our own secret buffers are wiped after use (`SecretBytes`, `wipeInPlace`), but libraries
/// below free copies we never see — swift-crypto's key-wrap output and HMAC key pads, Foundation's
/// `Data` slices of a decrypted segment. With `glibc.malloc.perturb` every `free` overwrites the
/// block, and with the per-thread cache off (`tcache_count=0`) no free skips that (a block of up
/// to 1 KiB freed into the cache keeps its bytes). The cost is a memset per free.
package enum HeapHygiene {
    static let tunables = "glibc.malloc.tcache_count=0:glibc.malloc.perturb=165"
    static let marker = "DATAPROTECTION_HEAP_HYGIENE"

    /// Re-executes this program with the tunables, once; returns when they are in force (or
    /// when re-executing is impossible, which only costs the defence in depth).
    package static func reexecIfNeeded() {
        let environment = ProcessInfo.processInfo.environment
        guard environment[marker] == nil else { return }
        let existing = environment["GLIBC_TUNABLES"].map { $0 + ":" } ?? ""
        setenv("GLIBC_TUNABLES", existing + tunables, 1)
        setenv(marker, "1", 1)
        // Same pid, same descriptors: socket activation's LISTEN_PID and fd 3 stay valid. The
        // executable's own path (not /proc/self/exe), so the process keeps its name for pgrep.
        let executable =
            (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? "/proc/self/exe"
        execv(executable, CommandLine.unsafeArgv)
        unsetenv(marker)
    }
}
