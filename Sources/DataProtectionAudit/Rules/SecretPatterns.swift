import Foundation

/// What looks like a secret in a preferences dictionary: a key named like one (password, token,
/// secret, API key, private key, credential, session) with a non-empty text value, or a value
/// shaped like one whatever its key (a PEM private key, a JSON Web Token, an AWS access key, a
/// GitHub or Slack token).
enum SecretPatterns {
    private static let keyWords = ["password", "passwd", "passcode", "secret", "token", "apikey", "api_key", "api-key",
                                   "privatekey", "private_key", "private-key", "credential", "sessionid", "session_id"]

    /// Why `value` under `key` looks like a secret, or `nil`.
    static func reason(key: String, value: Any) -> String? {
        guard let text = value as? String ?? (value as? Data).flatMap({ String(data: $0, encoding: .utf8) }), !text.isEmpty else {
            return nil
        }
        if let shape = shape(of: text) { return shape }
        let lowered = key.lowercased()
        if let word = keyWords.first(where: { lowered.contains($0) }) { return "its key names a \(word)" }
        return nil
    }

    private static func shape(of text: String) -> String? {
        if text.contains("-----BEGIN") && text.contains("PRIVATE KEY-----") { return "its value is a PEM private key" }
        if text.range(of: #"^eyJ[A-Za-z0-9_-]+\.eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$"#, options: .regularExpression) != nil {
            return "its value is a JSON Web Token"
        }
        if text.range(of: #"^(AKIA|ASIA)[0-9A-Z]{16}$"#, options: .regularExpression) != nil { return "its value is an AWS access key" }
        if text.range(of: #"^gh[pousr]_[A-Za-z0-9]{36,}$"#, options: .regularExpression) != nil { return "its value is a GitHub token" }
        if text.range(of: #"^xox[abprs]-[A-Za-z0-9-]{10,}$"#, options: .regularExpression) != nil { return "its value is a Slack token" }
        return nil
    }

    /// Every (key path, reason) in a preferences dictionary, nested dictionaries and arrays included.
    static func findings(in dictionary: [String: Any], prefix: String = "", depth: Int = 0) -> [(key: String, reason: String)] {
        guard depth < 64 else { return [] }
        var found: [(String, String)] = []
        for key in dictionary.keys.sorted() {
            let path = prefix.isEmpty ? key : prefix + "." + key
            switch dictionary[key] {
            case let nested as [String: Any]: found += findings(in: nested, prefix: path, depth: depth + 1)
            case let array as [Any]:
                for (index, element) in array.enumerated() {
                    if let nested = element as? [String: Any] { found += findings(in: nested, prefix: "\(path)[\(index)]", depth: depth + 1) }
                    else if let why = reason(key: key, value: element) { found.append(("\(path)[\(index)]", why)) }
                }
            case let value?: if let why = reason(key: key, value: value) { found.append((path, why)) }
            case nil: break
            }
        }
        return found
    }
}
