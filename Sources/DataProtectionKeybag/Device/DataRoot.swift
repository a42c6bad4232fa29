import Foundation

/// Where a device's keybag and device secret live.
///
/// Resolution order: an explicit path (`dpctl --root DIR`), then the `DP_ROOT` environment
/// variable, then `$XDG_DATA_HOME/dataprotection` (`~/.local/share/dataprotection`).
///
/// An explicit path or `DP_ROOT` that is *empty* is refused, never read as "the default": a
/// script's `--root "$UNSET"` must not reach the user's real device.
public enum DataRoot {
    /// The data root to use.
    /// - Throws: ``KeybagError/invalidArgument(_:)`` when `explicit` or `DP_ROOT` is the empty string.
    public static func resolve(
        _ explicit: String? = nil, environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws -> String {
        if let explicit {
            guard !explicit.isEmpty else {
                throw KeybagError.invalidArgument(
                    "the data root is an empty path (an unset variable?); name a directory")
            }
            return standardized(explicit)
        }
        if let env = environment["DP_ROOT"] {
            guard !env.isEmpty else {
                throw KeybagError.invalidArgument(
                    "DP_ROOT is set but empty (an unset variable?); unset it or name a directory")
            }
            return standardized(env)
        }
        if let xdg = environment["XDG_DATA_HOME"], xdg.hasPrefix("/") { return standardized(xdg + "/dataprotection") }
        let home = environment["HOME"] ?? NSHomeDirectory()
        return standardized(home + "/.local/share/dataprotection")
    }

    static func standardized(_ path: String) -> String {
        URL(fileURLWithPath: path).standardizedFileURL.path
    }
}
