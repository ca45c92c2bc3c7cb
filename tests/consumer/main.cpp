// A user project: find_package(conveyor), link conveyor::conveyor, include <conveyor/conveyor.h>.
#include <conveyor/conveyor.h>
#include <iostream>
int main() {
  conveyor::LoaderOptions o;
  o.batch_size = 4;
  o.workers = 2;
  conveyor::DataLoader loader(std::make_shared<conveyor::PatternSource>(10, 16), o);
  size_t rows = 0;
  for (auto& b : loader) rows += b.size();
  std::cout << loader.mode() << "\nrows " << rows << "\n";
  return rows == 10 ? 0 : 1;
}
