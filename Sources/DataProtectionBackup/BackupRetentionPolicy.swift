import Foundation

/// Which backups `forget` keeps, in restic's words: the last *n*, and the newest backup of each
/// of the last *n* hours, days, weeks, months and years that have one. A backup kept by any rule
/// is kept; the others are forgotten.
///
/// ```swift
/// let policy = BackupRetentionPolicy(keepLast: 3, keepDaily: 7, keepWeekly: 4)
/// let decisions = policy.decide(backups)        // newest first, each with its reasons
/// ```
///
/// Periods are calendar periods in `calendar`'s time zone (weeks are ISO 8601 weeks), counted
/// from the newest backup back, as restic counts them: a day without a backup uses up no rule.
public struct BackupRetentionPolicy: Sendable, Equatable {
    public var keepLast: Int
    public var keepHourly: Int
    public var keepDaily: Int
    public var keepWeekly: Int
    public var keepMonthly: Int
    public var keepYearly: Int

    public init(
        keepLast: Int = 0, keepHourly: Int = 0, keepDaily: Int = 0, keepWeekly: Int = 0, keepMonthly: Int = 0,
        keepYearly: Int = 0
    ) {
        self.keepLast = keepLast
        self.keepHourly = keepHourly
        self.keepDaily = keepDaily
        self.keepWeekly = keepWeekly
        self.keepMonthly = keepMonthly
        self.keepYearly = keepYearly
    }

    /// Whether any rule keeps anything: an empty policy would forget every backup, and is refused.
    public var keepsSomething: Bool {
        [keepLast, keepHourly, keepDaily, keepWeekly, keepMonthly, keepYearly].contains { $0 > 0 }
    }

    /// A rule's name, as `forget` prints it beside each backup it keeps.
    public enum Reason: String, Sendable, Codable, CaseIterable {
        case last, hourly, daily, weekly, monthly, yearly
        /// The oldest backup, kept because a period rule had backups to spare (restic 0.17's
        /// rule: with fewer periods than asked for, the oldest is kept too).
        case oldest
    }

    /// One backup and what the policy decided for it.
    public struct Decision: Sendable, Equatable {
        public var id: String
        public var created: Date
        /// The rules that keep it; empty: it is forgotten.
        public var reasons: [Reason]
        public var isKept: Bool { !reasons.isEmpty }
    }

    /// Decides for each backup (`id`, `created`), given oldest first, returned newest first.
    /// Backups of the same time keep the order they were given in (a repository orders two made
    /// in one second by when each was finished).
    public func decide(_ backups: [(id: String, created: Date)], calendar: Calendar = .current) -> [Decision] {
        let newestFirst = backups.enumerated().sorted {
            ($0.element.created, $0.offset) > ($1.element.created, $1.offset)
        }.map(\.element)
        var remaining: [Reason: Int] = [
            .last: keepLast, .hourly: keepHourly, .daily: keepDaily, .weekly: keepWeekly,
            .monthly: keepMonthly, .yearly: keepYearly,
        ]
        var lastPeriod: [Reason: [Int]] = [:]
        var decisions = newestFirst.map { backup in
            var reasons: [Reason] = []
            for reason in Reason.allCases where reason != .oldest && remaining[reason, default: 0] > 0 {
                let period = Self.period(of: backup.created, for: reason, calendar: calendar)
                // `last` keeps every backup; the others the newest of each period.
                if reason == .last || lastPeriod[reason] != period {
                    reasons.append(reason)
                    lastPeriod[reason] = period
                    remaining[reason, default: 0] -= 1
                }
            }
            return Decision(id: backup.id, created: backup.created, reasons: reasons)
        }
        // Fewer periods with a backup than a period rule asks for: the oldest is kept as well.
        let periodRules: [Reason] = [.hourly, .daily, .weekly, .monthly, .yearly]
        if periodRules.contains(where: { remaining[$0, default: 0] > 0 }), let oldest = decisions.indices.last,
            !decisions[oldest].isKept
        {
            decisions[oldest].reasons = [.oldest]
        }
        return decisions
    }

    /// The calendar period a date falls in, for one rule (`last` has none: every backup is its own).
    static func period(of date: Date, for reason: Reason, calendar: Calendar) -> [Int] {
        switch reason {
        case .last, .oldest: return []
        case .hourly:
            let c = calendar.dateComponents([.year, .month, .day, .hour], from: date)
            return [c.year ?? 0, c.month ?? 0, c.day ?? 0, c.hour ?? 0]
        case .daily:
            let c = calendar.dateComponents([.year, .month, .day], from: date)
            return [c.year ?? 0, c.month ?? 0, c.day ?? 0]
        case .weekly:
            var iso = Calendar(identifier: .iso8601)
            iso.timeZone = calendar.timeZone
            let c = iso.dateComponents([.yearForWeekOfYear, .weekOfYear], from: date)
            return [c.yearForWeekOfYear ?? 0, c.weekOfYear ?? 0]
        case .monthly:
            let c = calendar.dateComponents([.year, .month], from: date)
            return [c.year ?? 0, c.month ?? 0]
        case .yearly:
            return [calendar.component(.year, from: date)]
        }
    }
}
