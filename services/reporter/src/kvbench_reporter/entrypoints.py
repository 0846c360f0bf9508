"""What the `kvbench` CLI may use of the reporter without a server: the report's schema, the Grafana
dashboards and the page of a search's answer. The CLI imports nothing else of this service (checked by `make lint`)."""

from kvbench_reporter.dashboards import export_dashboards, push_dashboards
from kvbench_reporter.schema import Report, report_json_schema
from kvbench_reporter.search_page import search_html

__all__ = ["Report", "export_dashboards", "push_dashboards", "report_json_schema", "search_html"]
