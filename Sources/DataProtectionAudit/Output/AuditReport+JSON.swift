import DataProtectionKeybag
import DataProtectionSystem
import Foundation

/// The report as JSON for scripts (FORMAT.md §13.2): stable keys, findings in report order.
extension AuditReport {
    public struct JSONFinding: Encodable, Sendable {
        public let rule: String, name: String, severity: String, title: String, path: String, detail: String,
            why: String
        public let fix: Fix

        public struct Fix: Encodable, Sendable {
            public let automatic: Bool, call: String, command: String?
        }
    }

    public struct JSONReport: Encodable, Sendable {
        public let version: Int
        public let scope: [String]
        public let minimumSeverity: String
        public let itemsExamined: Int
        public let counts: [String: Int]
        public let findings: [JSONFinding]
    }

    /// The findings at or above `minimum`, as JSON. `command` gives the command line that fixes
    /// a finding, where the caller has one (`dpctl` does).
    public func json(minimum: AuditSeverity = .low, command: (AuditFinding) -> String? = { _ in nil }) throws -> Data {
        let shown = findings(atLeast: minimum)
        let report = JSONReport(
            version: 1, scope: scope.map(LosslessPath.display), minimumSeverity: minimum.rawValue,
            itemsExamined: itemsExamined,
            counts: Dictionary(
                uniqueKeysWithValues: AuditSeverity.allCases.map { s in
                    (s.rawValue, shown.filter { $0.severity == s }.count)
                }),
            findings: shown.map { f in
                JSONFinding(
                    rule: f.rule.id, name: f.rule.name, severity: f.severity.rawValue, title: f.rule.title,
                    path: LosslessPath.display(f.path),
                    detail: f.detail, why: f.rule.why,
                    fix: .init(automatic: f.fix.isAutomatic, call: f.fix.call, command: command(f)))
            })
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        return try encoder.encode(report)
    }
}
