import ArgumentParser
import DataProtectionKeybag
import Foundation

@main
struct DPBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dp-bench",
        abstract: "Benchmarks that put our figures beside a peer's, measured in the same run.",
        discussion:
            "Build in release mode: swift run -c release dp-bench files|fs|backup|sqlite|daemon|objects|apps|sharing|audit|tpm",
        version: DataProtectionVersion.string,
        subcommands: [
            FilesBenchmark.self, FileSystemBenchmark.self, BackupBenchmark.self, TPMBenchmark.self,
            SQLiteBenchmark.self, DaemonBenchmark.self, ObjectsBenchmark.self, AppsBenchmark.self, AppsProbe.self,
            SharingBenchmark.self, AuditBenchmark.self,
        ]
    )
}
