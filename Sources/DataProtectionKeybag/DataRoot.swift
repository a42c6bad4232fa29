import Foundation

/// Where a device's keybag and device secret live.
///
/// Resolution order: an explicit path (`dpctl --root DIR`), then the `DP_ROOT` environment
/// variable, then `$XDG_DATA_HOME/dataprotection` (`~/.local/share/dataprotection`).
public enum DataRoot {
    public static func resolve(_ explicit: String? = nil, environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let explicit, !explicit.isEmpty { return standardized(explicit) }
        if let env = environment["DP_ROOT"], !env.isEmpty { return standardized(env) }
        if let xdg = environment["XDG_DATA_HOME"], xdg.hasPrefix("/") { return standardized(xdg + "/dataprotection") }
        let home = environment["HOME"] ?? NSHomeDirectory()
        return standardized(home + "/.local/share/dataprotection")
    }

    static func standardized(_ path: String) -> String {
        URL(fileURLWithPath: path).standardizedFileURL.path
    }
}
