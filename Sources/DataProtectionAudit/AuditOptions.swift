import DataProtectionKeybag
import Foundation

/// What an audit counts as a finding where a threshold is a matter of taste.
public struct AuditOptions: Sendable {
    /// Files at least this large under `Documents` or `Library` (not `Library/Caches`) must be
    /// marked do-not-back-up (rule DP301). Default 5 MB.
    public var largeFileThreshold: Int64
    /// Inbox files older than this are reported (rule DP504). Default 7 days.
    public var inboxMaxAge: TimeInterval
    /// The time grants and Inbox files are judged at (a test passes its own).
    public var now: Date

    public init(largeFileThreshold: Int64 = 5_000_000, inboxMaxAge: TimeInterval = 7 * 86_400, now: Date = Date()) {
        self.largeFileThreshold = largeFileThreshold
        self.inboxMaxAge = inboxMaxAge
        self.now = now
    }
}

/// What an audit found, and how much it looked at.
public struct AuditReport: Sendable {
    /// The trees, apps or device audited, as given.
    public var scope: [String]
    /// Sorted by severity (highest first), then rule, then path.
    public var findings: [AuditFinding]
    /// Files, directories and links looked at.
    public var itemsExamined: Int

    public init(scope: [String], findings: [AuditFinding], itemsExamined: Int) {
        self.scope = scope
        var seen = Set<[UInt8]>()
        self.findings = findings.filter { seen.insert($0.key).inserted }.sorted { a, b in
            if a.severity != b.severity { return a.severity > b.severity }
            return a.key.lexicographicallyPrecedes(b.key)   // rule, then path bytes, then discriminator
        }
        self.itemsExamined = itemsExamined
    }

    /// The findings at or above `severity`.
    public func findings(atLeast severity: AuditSeverity) -> [AuditFinding] {
        findings.filter { $0.severity >= severity }
    }
}
