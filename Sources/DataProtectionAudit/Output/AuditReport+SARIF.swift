import DataProtectionKeybag
import DataProtectionSystem
import Foundation

/// The report as a SARIF 2.1.0 log (OASIS; FORMAT.md §13.3), which GitHub code scanning and other
/// CI dashboards read: one run of the tool `dpctl audit`, every rule described once, one result
/// per finding located relative to the audited directory (`uriBaseId` `AUDITROOT`).
extension AuditReport {
    /// The findings at or above `minimum` as SARIF. `base` is the directory locations are given
    /// relative to (its URI is the run's `AUDITROOT`); paths outside it are absolute `file:` URIs.
    public func sarif(
        base: String, minimum: AuditSeverity = .low, toolVersion: String = "1.0.0",
        command: (AuditFinding) -> String? = { _ in nil }
    ) throws -> Data {
        let rules = AuditRule.allCases
        let ruleObjects: [[String: Any]] = rules.map { rule in
            [
                "id": rule.id,
                "name": rule.name,
                "shortDescription": ["text": rule.title],
                "fullDescription": ["text": rule.why],
                "help": ["text": rule.why],
                "defaultConfiguration": ["level": Self.level(rule.severity)],
                "properties": [
                    "security-severity": Self.securitySeverity(rule.severity), "tags": ["security", "data-protection"],
                    "precision": "high",
                ],
            ]
        }
        let baseDirectory = base.hasSuffix("/") ? String(base.dropLast()) : base
        let results: [[String: Any]] = findings(atLeast: minimum).map { finding in
            var location: [String: Any] = [:]
            var relative = finding.path
            if finding.path == baseDirectory {
                relative = "."
                location = ["uri": "./", "uriBaseId": "AUDITROOT"]
            } else if finding.path.hasPrefix(baseDirectory + "/") {
                relative = String(finding.path.dropFirst(baseDirectory.count + 1))
                location = ["uri": Self.percentEncoded(relative), "uriBaseId": "AUDITROOT"]
            } else {
                location = ["uri": "file://" + Self.percentEncoded(finding.path)]
            }
            var fixText = finding.fix.isAutomatic ? "Fixed by dpctl audit --fix. " : ""
            fixText += command(finding).map { "Fix: \($0)" } ?? "Fix: \(finding.fix.call)"
            var properties: [String: Any] = [
                "severity": finding.severity.rawValue, "automaticFix": finding.fix.isAutomatic,
                "call": finding.fix.call,
            ]
            if let line = command(finding) { properties["command"] = line }
            return [
                "ruleId": finding.rule.id,
                "ruleIndex": rules.firstIndex(of: finding.rule)!,
                "level": Self.level(finding.severity),
                "message": ["text": "\(finding.rule.title): \(finding.detail). \(fixText)"],
                "locations": [["physicalLocation": ["artifactLocation": location, "region": ["startLine": 1]]]],
                // Stable across runs and places: the rule, the path below the audited directory,
                // and what tells apart findings on one item (a preference key, a grant).
                "partialFingerprints": [
                    "dpAuditFinding/v1": [finding.rule.id, Self.percentEncoded(relative), finding.discriminator].joined(
                        separator: ":")
                ],
                "properties": properties,
            ]
        }
        let log: [String: Any] = [
            "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
            "version": "2.1.0",
            "runs": [
                [
                    "tool": ["driver": ["name": "dpctl audit", "semanticVersion": toolVersion, "rules": ruleObjects]],
                    "originalUriBaseIds": ["AUDITROOT": ["uri": "file://" + Self.percentEncoded(baseDirectory) + "/"]],
                    "invocations": [["executionSuccessful": true]],
                    "columnKind": "unicodeCodePoints",
                    "results": results,
                ]
            ],
        ]
        return try JSONSerialization.data(
            withJSONObject: log, options: [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes])
    }

    /// SARIF's levels: `error` for high, `warning` for medium, `note` for low.
    static func level(_ severity: AuditSeverity) -> String {
        switch severity {
        case .high: "error"
        case .medium: "warning"
        case .low: "note"
        }
    }

    /// GitHub code scanning's `security-severity` (0–10) for each severity.
    static func securitySeverity(_ severity: AuditSeverity) -> String {
        switch severity {
        case .high: "8.0"
        case .medium: "5.0"
        case .low: "2.0"
        }
    }

    /// A path's bytes as a URI path: unreserved characters and `/` kept, every other byte `%XX`
    /// (names that are not UTF-8 survive).
    static func percentEncoded(_ path: String) -> String {
        var out = ""
        for byte in LosslessPath.bytes(of: path) {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"),
                UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"), UInt8(ascii: "/"):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                out += String(format: "%%%02X", byte)
            }
        }
        return out
    }
}
