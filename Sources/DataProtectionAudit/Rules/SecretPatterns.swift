import Foundation

/// What looks like a secret in a preferences dictionary: a key named like one (password, token,
/// secret, API key, private key, credential, session) with a non-empty text value, or a value
/// shaped like one whatever its key (a PEM private key, a JSON Web Token, an AWS access key, a
/// GitHub or Slack token).
enum SecretPatterns {
    private static let keyWords = [
        "password", "passwd", "passcode", "secret", "token", "apikey", "api_key", "api-key",
        "privatekey", "private_key", "private-key", "credential", "sessionid", "session_id",
    ]

    /// Why `value` under `key` looks like a secret, or `nil`.
    static func reason(key: String, value: Any) -> String? {
        guard let text = value as? String ?? (value as? Data).flatMap({ String(data: $0, encoding: .utf8) }),
            !text.isEmpty
        else {
            return nil
        }
        if let shape = shape(of: text) { return shape }
        let lowered = key.lowercased()
        if let word = keyWords.first(where: { lowered.contains($0) }) { return "its key names a \(word)" }
        return nil
    }

    private static func shape(of text: String) -> String? {
        if text.contains("-----BEGIN") && text.contains("PRIVATE KEY-----") { return "its value is a PEM private key" }
        if text.range(of: #"^eyJ[A-Za-z0-9_-]+\.eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$"#, options: .regularExpression)
            != nil
        {
            return "its value is a JSON Web Token"
        }
        if text.range(of: #"^(AKIA|ASIA)[0-9A-Z]{16}$"#, options: .regularExpression) != nil {
            return "its value is an AWS access key"
        }
        if text.range(of: #"^gh[pousr]_[A-Za-z0-9]{36,}$"#, options: .regularExpression) != nil {
            return "its value is a GitHub token"
        }
        if text.range(of: #"^xox[abprs]-[A-Za-z0-9-]{10,}$"#, options: .regularExpression) != nil {
            return "its value is a Slack token"
        }
        return nil
    }

    /// How much one preferences file may cost: values visited and findings kept. A property list
    /// can share one dictionary among many keys (`{k0: d, k1: d}` per level), so 191 bytes can
    /// stand for 2^20 paths; the walk stops at the budget and says so.
    static let visitLimit = 100_000
    static let findingLimit = 1_000

    /// The walk's result: what was found, and whether the budget ran out before the end.
    struct Scan {
        var found: [(key: String, reason: String)] = []
        var visited = 0
        var exhausted = false
    }

    /// Every (key path, reason) in a preferences dictionary, nested dictionaries and arrays
    /// included, within ``visitLimit`` values and ``findingLimit`` findings.
    static func scan(_ dictionary: [String: Any]) -> Scan {
        var scan = Scan()
        walk(dictionary, prefix: "", depth: 0, into: &scan)
        return scan
    }

    private static func walk(_ dictionary: [String: Any], prefix: String, depth: Int, into scan: inout Scan) {
        guard depth < 64 else { return }
        for key in dictionary.keys.sorted() {
            guard !scan.exhausted else { return }
            scan.visited += 1
            if scan.visited > visitLimit || scan.found.count >= findingLimit { scan.exhausted = true; return }
            let path = prefix.isEmpty ? key : prefix + "." + key
            switch dictionary[key] {
            case let nested as [String: Any]: walk(nested, prefix: path, depth: depth + 1, into: &scan)
            case let array as [Any]:
                for (index, element) in array.enumerated() {
                    guard !scan.exhausted else { return }
                    scan.visited += 1
                    if scan.visited > visitLimit { scan.exhausted = true; return }
                    if let nested = element as? [String: Any] {
                        walk(nested, prefix: "\(path)[\(index)]", depth: depth + 1, into: &scan)
                    } else if let why = reason(key: key, value: element) {
                        scan.found.append(("\(path)[\(index)]", why))
                    }
                }
            case let value?: if let why = reason(key: key, value: value) { scan.found.append((path, why)) }
            case nil: break
            }
        }
    }
}
