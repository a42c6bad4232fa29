import Foundation

/// Where a repository lives when it is not a directory of this machine: any storage rclone
/// reaches (S3 and its peers, SFTP, WebDAV …), as restic reaches them (`restic -r rclone:…`).
///
///     rclone:REMOTE:PATH          a remote of the user's rclone configuration
///     sftp:[USER@]HOST:PATH       an SFTP server (through rclone's SFTP client)
///     sftp://[USER@]HOST[:PORT]/PATH
///
/// For `sftp:` the server's key must be known (`~/.ssh/known_hosts`, or the file
/// `RCLONE_SFTP_KNOWN_HOSTS_FILE` names): a server never seen is refused, never trusted on first
/// use. The key is the SSH agent's, the file `RCLONE_SFTP_KEY_FILE` names, or the first of
/// `~/.ssh/id_ed25519`, `id_ecdsa`, `id_rsa`.
public struct RemoteLocation: Sendable, Equatable, CustomStringConvertible {
    /// The location as rclone names it: `REMOTE:PATH`, or an on-the-fly remote (`:sftp,host=…:PATH`).
    public let rcloneTarget: String
    /// The location as it was written, any password in it blotted out.
    public let description: String
    /// What names the storage, whichever key or known-hosts file reaches it: the staging area
    /// and the lock's identity are keyed by it (`sftp://USER@HOST:PORT/PATH`, or rclone's
    /// `REMOTE:PATH`).
    let identity: String

    /// Whether `argument` names a remote location (`rclone:` or `sftp:`), as opposed to a directory.
    public static func isRemote(_ argument: String) -> Bool {
        argument.hasPrefix("rclone:") || argument.hasPrefix("sftp:")
    }

    /// Parses a remote location.
    /// - Throws: ``BackupError/badRemote(_:reason:)`` naming what is wrong.
    public init(_ argument: String, environment: [String: String] = ProcessInfo.processInfo.environment) throws {
        description = Self.redacting(argument)
        func bad(_ why: String) -> BackupError { .badRemote(Self.redacting(argument), reason: why) }
        if argument.hasPrefix("rclone:") {
            let target = String(argument.dropFirst("rclone:".count))
            // REMOTE:PATH; the remote's name as rclone allows it, or an on-the-fly `:backend,…:`.
            guard let colon = target.firstIndex(of: ":"), colon != target.startIndex || target.dropFirst().contains(":")
            else {
                throw bad("expected rclone:REMOTE:PATH (a remote of `rclone config`)")
            }
            guard !target.contains("\n"), !target.hasPrefix("-") else { throw bad("not an rclone remote") }
            rcloneTarget = target
            identity = target
            return
        }
        guard argument.hasPrefix("sftp:") else { throw bad("expected rclone:REMOTE:PATH or sftp:[USER@]HOST:PATH") }
        var user: String?, host: String, port: Int?, path: String
        if argument.hasPrefix("sftp://") {
            let rest = argument.dropFirst("sftp://".count)
            guard let slash = rest.firstIndex(of: "/") else { throw bad("expected sftp://[USER@]HOST[:PORT]/PATH") }
            var authority = String(rest[..<slash])
            path = String(rest[slash...])
            if let at = authority.lastIndex(of: "@") {
                user = String(authority[..<at])
                authority = String(authority[authority.index(after: at)...])
            }
            if let colon = authority.lastIndex(of: ":") {
                guard let number = Int(authority[authority.index(after: colon)...]), (1...65535).contains(number) else {
                    throw bad("the port is not a number from 1 to 65535")
                }
                port = number
                authority = String(authority[..<colon])
            }
            host = authority
        } else {
            let rest = argument.dropFirst("sftp:".count)
            guard let colon = rest.firstIndex(of: ":") else { throw bad("expected sftp:[USER@]HOST:PATH") }
            var authority = String(rest[..<colon])
            path = String(rest[rest.index(after: colon)...])
            if let at = authority.lastIndex(of: "@") {
                user = String(authority[..<at])
                authority = String(authority[authority.index(after: at)...])
            }
            host = authority
        }
        let safe = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")
        guard !host.isEmpty, host.allSatisfy(safe.contains) else {
            throw bad("the host name \(host) has characters a host name does not")
        }
        if let user {
            guard !user.isEmpty, user.allSatisfy(safe.contains) else {
                throw bad("the user name has characters a user name does not")
            }
        }
        guard !path.isEmpty, !path.contains("\n") else { throw bad("no path on the server") }

        // rclone's check after each upload runs `md5sum` on the server, one command per file
        // (measured: 13 times slower for a thousand objects); what is stored is named by its
        // SHA-256 and authenticated, and `verify` checks it.
        var options = ["host=\(host)", "disable_hashcheck=true"]
        if let user { options.append("user=\(user)") }
        if let port { options.append("port=\(port)") }
        let home = environment["HOME"] ?? NSHomeDirectory()
        // An empty value is no value: an empty RCLONE_SFTP_KNOWN_HOSTS_FILE must not turn checks off.
        func set(_ name: String) -> Bool { !(environment[name] ?? "").isEmpty }
        if !set("RCLONE_SFTP_KNOWN_HOSTS_FILE") {
            let knownHosts = home + "/.ssh/known_hosts"
            guard FileManager.default.fileExists(atPath: knownHosts) else {
                throw bad(
                    "no \(knownHosts) to check the server's key against: connect once with ssh to record it (or set RCLONE_SFTP_KNOWN_HOSTS_FILE)"
                )
            }
            options.append("known_hosts_file=\(Self.quoted(knownHosts))")
        }
        if !set("RCLONE_SFTP_KEY_FILE"), !set("SSH_AUTH_SOCK"),
            let key = ["id_ed25519", "id_ecdsa", "id_rsa"].map({ home + "/.ssh/" + $0 }).first(
                where: FileManager.default.fileExists)
        {
            options.append("key_file=\(Self.quoted(key))")
        }
        rcloneTarget = ":sftp," + options.joined(separator: ",") + ":" + path
        // A path relative to the login directory after a colon, an absolute one as it is: never the same.
        identity = "sftp://\(user ?? "")@\(host):\(port ?? 22)" + (path.hasPrefix("/") ? "" : ":") + path
    }

    /// `text` with this location's connection string shown as the user wrote the location, and
    /// any password in it blotted out: what rclone prints may be shown.
    func redacted(_ text: String) -> String {
        Self.redacting(text.replacingOccurrences(of: rcloneTarget, with: description))
    }

    /// `text` with the values of rclone's password options (`pass=`, `password=`, `key_file_pass=`,
    /// `secret_access_key=` …) in connection strings replaced by `***`.
    static func redacting(_ text: String) -> String {
        guard
            let pattern = try? NSRegularExpression(
                pattern:
                    #"(?<![A-Za-z0-9_])((?:pass|password|key_file_pass|key_pem|secret_access_key|token|client_secret|session_token|account_key|key)=)("(?:[^"]|"")*"|'[^']*'|[^,:\s]*)"#,
                options: [.caseInsensitive])
        else { return text }
        let named = pattern.stringByReplacingMatches(
            in: text, range: NSRange(text.startIndex..., in: text), withTemplate: "$1***")
        // A password in a URL (`https://user:password@host/`, `sftp://user:password@host/`).
        guard let inURL = try? NSRegularExpression(pattern: #"(://[^/@\s:]*:)[^@\s/]*@"#) else { return named }
        return inURL.stringByReplacingMatches(
            in: named, range: NSRange(named.startIndex..., in: named), withTemplate: "$1***@")
    }

    /// A value in an rclone connection string, quoted (doubling its quotes) as rclone reads it.
    static func quoted(_ value: String) -> String { "\"" + value.replacingOccurrences(of: "\"", with: "\"\"") + "\"" }

    /// A path inside the location, as rclone names it.
    func appending(_ relative: String) -> String {
        rcloneTarget.hasSuffix("/") || rcloneTarget.hasSuffix(":")
            ? rcloneTarget + relative : rcloneTarget + "/" + relative
    }
}
