import DataProtectionTestSupport
import Foundation
import Testing

/// Help reaches the user as help (exit 0, on standard output), through every spelling.
@Suite struct HelpTests {
    @Test func helpIsPrintedNotReportedAsAnError() throws {
        let cli = CLI.make()
        for args in [["--help"], ["help"], ["help", "app"], ["app", "--help"], ["app", "run", "--help"], ["defaults", "write", "--help"], ["status", "-h"]] {
            let result = try cli.run(args)
            #expect(result.status == 0, "\(args): \(result.stderr)")
            #expect(result.out.contains("USAGE:"), "\(args): \(result.out.prefix(200))")
            #expect(!result.stderr.contains("CommandError"), "\(args): \(result.stderr)")
        }
        #expect(try cli.run(["--help"]).out.contains("app"))
        #expect(try cli.run(["--help"]).out.contains("defaults"))
    }
}
